"""The trail's hot-path records: what the sessions report, the ack folded into its
delivery's record, chunks serialised while newer events stay, and the queues a refused
publish did not reach."""
from __future__ import annotations

import pytest

from broker.amqp import spec
from broker.amqp.codec import method_frame
from broker.audit import events
from broker.audit.events import ACKC, DACK, DELC, PUBC, WIDTH
from broker.audit.spool import loads
from broker.broker import Broker
from broker.config import AuditSettings, Config
from broker.queues.ops import CallerReported, ObserverList, Op, OpRecorder

from ..support import SessionClient, declare_queue, make_message


def _broker(tmp_path, **settings) -> Broker:
    return Broker(Config(data_dir=str(tmp_path / "data"),
                         audit=AuditSettings(dir=str(tmp_path / "trail"), **settings)))


def _clients(broker, queue="q", **declare):
    pub = SessionClient(broker, peer="127.0.0.1:40000")
    cons = SessionClient(broker, peer="127.0.0.1:40001")
    pub.open_channel(1)
    cons.open_channel(1)
    pub.declare_queue(1, queue, **declare)
    return pub, cons


def _deliver(broker, n: int) -> SessionClient:
    """``n`` messages published to ``q`` and delivered to a manual-ack consumer, not acked."""
    pub, cons = _clients(broker)
    cons.ok(1, spec.Basic.Qos(prefetch_count=n), spec.Basic.QosOk)
    cons.consume(1, "q", tag="c1")
    for i in range(n):
        pub.publish(1, b"m%d" % i, routing_key="q")
    cons.output()
    return cons


def _all_events(trail) -> list[tuple]:
    """Every event recorded so far, from the serialised frames and the buffer, in order."""
    frames, _ = trail._take_frames()
    out: list[tuple] = []
    seq = frames[0][0] if frames else 0
    for first, count, data in frames:
        rows = loads(data)
        assert first == seq and len(rows) == count  # counts include the folded acks
        seq += count
        out += [ev[:events.ARITY[ev[0]]] for ev in rows]
    return out


def test_an_ack_while_its_delivery_is_buffered_folds_into_that_record(tmp_path):
    broker = _broker(tmp_path)
    trail = broker.audit
    cons = _deliver(broker, 3)
    cons.send(method_frame(1, spec.Basic.Ack(3, True)))
    assert trail.buf[::WIDTH].count(DACK) == 3 and trail.buf[::WIDTH].count(ACKC) == 0
    evs = _all_events(trail)
    kinds = [ev[0] for ev in evs]
    assert kinds.count(PUBC) == kinds.count(DELC) == kinds.count(ACKC) == 3
    for i, ev in enumerate(evs):
        if ev[0] == DELC:  # its ack follows it, with the delivery's fields
            ack = evs[i + 1]
            assert ack[0] == ACKC
            assert ack[2:6] == ev[2:6] and ack[6] == ev[8]  # queue, msg, ctag, tag; channel
            assert ack[1] >= ev[1]
    assert [ev[5] for ev in evs if ev[0] == ACKC] == [1, 2, 3]  # delivery tags


def test_an_ack_after_its_delivery_was_serialised_is_a_record_of_its_own(tmp_path):
    broker = _broker(tmp_path, chunk_events=2)  # keeps 8 events, serialises 2 at a time
    trail = broker.audit
    cons = _deliver(broker, 20)
    assert trail.held  # the oldest chunks are serialised already
    cons.send(method_frame(1, spec.Basic.Ack(20, True)))
    evs = _all_events(trail)
    kinds = [ev[0] for ev in evs]
    assert kinds.count(PUBC) == kinds.count(DELC) == kinds.count(ACKC) == 20
    acks = {ev[3]: ev for ev in evs if ev[0] == ACKC}
    dels = {ev[3]: ev for ev in evs if ev[0] == DELC}
    assert acks.keys() == dels.keys()
    assert all(acks[m][5] == dels[m][5] for m in acks)  # the same delivery tag
    # nothing lost or counted twice across the serialised chunks
    assert len(evs) == 60 and trail.held_events == 0


def test_a_queue_that_refuses_a_publish_is_not_among_its_queues(tmp_path):
    broker = _broker(tmp_path)
    trail = broker.audit
    pub, _ = _clients(broker, "full", arguments={"x-max-length": 1,
                                                  "x-overflow": "reject-publish"})
    pub.declare_queue(1, "dedup", arguments={"x-message-deduplication": True})
    pub.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    pub.publish(1, b"1", routing_key="full")
    pub.publish(1, b"2", routing_key="full")  # refused: nacked
    pub.publish(1, b"3", routing_key="dedup", headers={"x-deduplication-header": "k"})
    pub.publish(1, b"4", routing_key="dedup", headers={"x-deduplication-header": "k"})
    pubs = [ev for ev in _all_events(trail) if ev[0] == PUBC]
    assert [(ev[10], ev[11]) for ev in pubs] == [
        ("full", "routed"), (None, "nacked"), ("dedup", "routed"), (None, "routed")]


def test_a_queue_leaves_what_callers_report_to_an_observer_that_says_so(tmp_path):
    class Reported(OpRecorder, CallerReported):
        pass

    broker = Broker(Config(data_dir=str(tmp_path)))
    q = declare_queue(broker.vhosts["/"], "q")
    plain, reported = OpRecorder(), Reported()
    q.observers.append(plain)
    q.observers.append(reported)
    assert isinstance(q.observers, ObserverList) and q.observers.unreported == (plain,)
    q.enqueue(make_message(b"a"), reported=True)
    q.enqueue(make_message(b"b"))
    a, b = q.get(), q.get()
    q.ack(a, None, reported=True)
    q.ack(b, None)
    assert [op for op, _ in plain.ops] == [Op.ENQUEUE, Op.ENQUEUE, Op.DELIVER, Op.DELIVER,
                                          Op.SETTLE, Op.SETTLE]
    assert [op for op, _ in reported.ops] == [Op.ENQUEUE, Op.SETTLE]  # b's, unreported
    q.observers.remove(plain)
    assert q.observers.unreported == ()


@pytest.mark.parametrize("policy", ["drop", "block"])
def test_the_bound_counts_serialised_events_too(tmp_path, policy):
    broker = _broker(tmp_path, chunk_events=2, buffer_events=6, policy=policy)
    trail = broker.audit
    q = broker.vhosts["/"].ensure_queue("q", False, {})
    for _ in range(12):
        q.enqueue(make_message(b"x"))
    kept = len(trail.events())
    if policy == "drop":
        assert kept + trail.dropped == 12 and kept <= 7
    else:
        assert kept == 12 and broker.alarms == {"audit trail"}
