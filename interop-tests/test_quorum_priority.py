"""Quorum queue priorities, RabbitMQ 4's rule (rabbit_fifo_q): two levels -- 0-4 or none
normal, 5 and above high -- served two high for one normal (a high message older than the
oldest normal one keeps the third turn); ``x-max-priority`` is refused on a quorum queue.
RabbitMQ 3.10 (the machine's reference) has no quorum priorities: the ordering test is
skipped there; the refusal is checked on both."""
from __future__ import annotations

import pika
import pytest
from helpers import get_one

PRIOS = [0, 7, 3, 9, None, 5, 4, 6, 1, 8, 2, 5, 10, 0]


def expected(prios) -> list[bytes]:
    hi = [i for i, p in enumerate(prios) if (p or 0) > 4]
    no = [i for i, p in enumerate(prios) if (p or 0) <= 4]
    out, counter = [], 0
    while hi or no:
        take_hi = hi and (counter != 2 or not no or hi[0] < no[0])
        out.append((hi if take_hi else no).pop(0))
        counter = 0 if counter == 2 else counter + 1
    return [b"m%02d" % i for i in out]


def _major(conn) -> int:
    version = conn._impl.server_properties.get("version", b"0")
    version = version.decode() if isinstance(version, bytes) else str(version)
    return int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0


def test_two_levels_two_to_one(conn, ch, uid, cleanup, external_broker):
    if external_broker and _major(conn) < 4:
        pytest.skip("RabbitMQ before 4.0 has no quorum queue priorities (FIFO order)")
    q = cleanup.queue(uid)
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i, p in enumerate(PRIOS):
        ch.basic_publish("", q, b"m%02d" % i, pika.BasicProperties(priority=p, delivery_mode=2))
    got = [get_one(ch, q)[2] for _ in PRIOS]
    assert got == expected(PRIOS)


def test_max_priority_refused_on_a_quorum_queue(ch, uid, cleanup):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(cleanup.queue(uid), durable=True,
                         arguments={"x-queue-type": "quorum", "x-max-priority": 5})
    assert ei.value.reply_code == 406
    assert "invalid arg 'x-max-priority'" in ei.value.reply_text
