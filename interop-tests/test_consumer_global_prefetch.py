"""A channel's global prefetch (basic.qos global=true) is shared by its consumers on several
queues: an ack on one queue gives the channel's credit back to the others too, which then
deliver what waits in them without another publish (RabbitMQ's limiter unblocks every queue
of the channel)."""
from __future__ import annotations

from helpers import wait_for


def test_ack_on_one_queue_frees_the_other_queues_of_the_channel(connect):
    conn = connect()
    ch = conn.channel()
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got: dict[str, list] = {q1: [], q2: []}
    ch.basic_consume(q1, lambda c, m, p, b: got[q1].append(m), auto_ack=False)
    ch.basic_consume(q2, lambda c, m, p, b: got[q2].append(m), auto_ack=False)
    ch.confirm_delivery()
    ch.basic_publish("", q1, b"one")
    wait_for(lambda: len(got[q1]) == 1, conn=conn)
    ch.basic_publish("", q2, b"two")      # the channel's one credit is taken: it waits
    ch.basic_publish("", q2, b"three")
    conn.sleep(0.3)
    assert len(got[q2]) == 0
    ch.basic_ack(got[q1][0].delivery_tag)  # credit back: q2 delivers, nothing published
    wait_for(lambda: len(got[q2]) == 1, conn=conn, msg="q2's first message after the ack")
    ch.basic_ack(got[q2][0].delivery_tag)
    wait_for(lambda: len(got[q2]) == 2, conn=conn, msg="q2's second message after its ack")
