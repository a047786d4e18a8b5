"""The stream queue type through a broker Session (sans-IO): declare, offsets, credit,
filters, records, memory per consumer, recovery of the log under a new broker."""
from __future__ import annotations

import pytest

from broker.amqp import spec
from broker.broker import Broker
from broker.message import Message
from broker.persistence import MemoryStore
from broker.queues.stream import StreamQueue
from broker.queues.stream_args import OffsetSpecError, age_seconds, offset_spec
from broker.streams import record
from broker.streams.log import StreamStore, Timestamp

from ..conftest import _config

S = {"x-queue-type": "stream"}


def deliveries(written) -> list:
    return [w for w in written if isinstance(w.method, spec.Basic.Deliver)]


def _stream(c, name="s", **arguments):
    c.open_channel(1)
    c.declare_queue(1, name, durable=True, arguments={**S, **arguments})


def test_declare_makes_a_stream_queue(session_client, broker):
    c = session_client()
    _stream(c)
    q = broker.vhosts["/"].queues["s"]
    assert isinstance(q, StreamQueue) and q.queue_type.name == "stream"


def test_publish_replay_offsets_and_credit(session_client, broker):
    c = session_client()
    _stream(c)
    for i in range(5):
        c.publish(1, b"m%d" % i, routing_key="s", headers={"i": i})
    q = broker.vhosts["/"].queues["s"]
    assert q.message_count == 5 and q.log.committed_offset == 4
    c.ok(1, spec.Basic.Qos(0, 2, False), spec.Basic.QosOk)
    ds = deliveries(c.consume(1, "s", tag="a", arguments={"x-stream-offset": "first"}))
    assert [d.body for d in ds] == [b"m0", b"m1"]  # the prefetch holds the rest
    assert [d.headers["x-stream-offset"] for d in ds] == [0, 1]
    assert ds[0].headers["i"] == 0
    ds = deliveries(c.call(1, spec.Basic.Ack(2, True)))
    assert [d.body for d in ds] == [b"m2", b"m3"]
    # a second consumer from offset 3 reads the same log; nothing was removed
    c.open_channel(2)
    c.ok(2, spec.Basic.Qos(0, 10, False), spec.Basic.QosOk)
    ds = deliveries(c.consume(2, "s", tag="b", arguments={"x-stream-offset": 3}))
    assert [d.body for d in ds] == [b"m3", b"m4"]
    assert q.message_count == 5
    # new messages reach both consumers ("b" has credit, "a" after its ack)
    ds = deliveries(c.publish(1, b"m5", routing_key="s"))
    assert [(d.method.consumer_tag, d.body) for d in ds] == [("b", b"m5")]


def test_consumer_without_offset_reads_new_messages_only(session_client):
    c = session_client()
    _stream(c)
    c.publish(1, b"old", routing_key="s")
    c.ok(1, spec.Basic.Qos(0, 10, False), spec.Basic.QosOk)
    assert deliveries(c.consume(1, "s")) == []
    assert [d.body for d in deliveries(c.publish(1, b"new", routing_key="s"))] == [b"new"]


def test_filters_exact_server_side(session_client):
    c = session_client()
    _stream(c)
    for i, v in enumerate(["red", "blue", None, "red"]):
        headers = {"x-stream-filter-value": v} if v else {}
        c.publish(1, b"%d" % i, routing_key="s", headers=headers)
    c.ok(1, spec.Basic.Qos(0, 10, False), spec.Basic.QosOk)
    ds = deliveries(c.consume(1, "s", tag="r", arguments={"x-stream-offset": "first",
                                                          "x-stream-filter": "red"}))
    assert [d.body for d in ds] == [b"0", b"3"]
    ds = deliveries(c.consume(1, "s", tag="u", arguments={
        "x-stream-offset": "first", "x-stream-filter": ["blue"], "x-stream-match-unfiltered": True}))
    assert [d.body for d in ds] == [b"1", b"2"]


def test_connection_close_returns_credit_only(session_client, broker):
    c = session_client()
    _stream(c)
    c.publish(1, b"x", routing_key="s")
    c.ok(1, spec.Basic.Qos(0, 10, False), spec.Basic.QosOk)
    assert len(deliveries(c.consume(1, "s", arguments={"x-stream-offset": "first"}))) == 1
    q = broker.vhosts["/"].queues["s"]
    assert q.unacked_count == 1
    c.close_connection()
    assert q.unacked_count == 0 and not q.consumers and q.message_count == 1


def test_delete_removes_the_log(session_client, broker, tmp_path):
    c = session_client()
    _stream(c)
    c.publish(1, b"x", routing_key="s")
    directory = broker.vhosts["/"].queues["s"].log.directory
    c.ok(1, spec.Queue.Delete(queue="s"), spec.Queue.DeleteOk)
    import os
    assert not os.path.exists(directory)


def test_log_comes_back_under_a_new_broker(tmp_path, session_client, broker):
    """The log outlives the broker object: a queue recreated (as recovery does) reads it."""
    c = session_client()
    _stream(c, "keep", **{"x-max-age": "1D"})
    for i in range(3):
        c.publish(1, b"k%d" % i, routing_key="keep")
    broker.streams.commit_all()
    for lg in list(broker.streams.logs.values()):
        lg.close()
    b2 = Broker(_config(tmp_path), MemoryStore())
    from broker.persistence.recovery import new_queue
    vhost = b2.vhosts["/"]
    q = new_queue(b2, vhost, "keep", durable=True, arguments={**S, "x-max-age": "1D"})
    vhost.add_queue(q, persist=False)
    assert q.message_count == 3 and q.log.max_age == 86400
    reader = q.log.reader("first")
    bodies = []
    while (chunk := reader.next_chunk()) is not None:
        bodies += [record.decode(r)[4] for _o, r in chunk.records()]
    assert bodies == [b"k0", b"k1", b"k2"]
    reader.close()


def test_record_of_another_client_reads_as_a_message():
    """An AMQP 1.0 message written by a Stream-protocol client: properties, application
    properties and data sections."""
    raw = (b"\x00\x53\x73\xc0\x0d\x03\xa1\x03mid\x40\xa1\x04to-q"  # properties: id, -, to
           b"\x00\x53\x74\xc1\x09\x02\xa1\x01k\xa1\x03val"  # application-properties
           b"\x00\x53\x75\xa0\x05hello")  # data
    exchange, rk, props_raw, props, body = record.decode(raw)
    assert body == b"hello" and props["message_id"] == "mid" and props["headers"] == {"k": "val"}
    assert props_raw


def test_record_round_trip():
    from broker.amqp.fields import decode_properties, encode_properties
    raw = encode_properties({"content_type": "a/b", "headers": {"h": b"v", "n": 1}})
    m = Message("x", "k" * 300, raw, decode_properties(raw), b"b" * 70000)
    assert record.decode(record.encode(m)) == ("x", "k" * 300, raw, decode_properties(raw),
                                               b"b" * 70000)


@pytest.mark.parametrize("value, want", [
    (None, "next"), ("first", "first"), (b"last", "last"), ("next", "next"), (7, 7), (-3, 0),
])
def test_offset_specs(value, want):
    assert offset_spec(value) == want


def test_offset_spec_interval_and_timestamp():
    from broker.amqp.fields import Timestamp as AmqpTs
    assert offset_spec("1h", now=10_000.0) == Timestamp((10_000 - 3600) * 1000)
    assert offset_spec(AmqpTs(5)) == Timestamp(5000)
    for bad in ("bogus", "0h", True, 1.5):
        with pytest.raises(OffsetSpecError):
            offset_spec(bad)
    assert age_seconds("7D") == 7 * 86400 and age_seconds("1Y") == 365 * 86400
    assert age_seconds("10X") is None


def test_consumer_memory_is_one_chunk(session_client, broker):
    """A consumer far behind holds at most one chunk's records, not the stream."""
    c = session_client()
    _stream(c)
    broker.streams.running = True  # commits wait for commit_all, as for the group commit task
    for _ in range(3):
        for i in range(1000):
            c.publish(1, b"%d" % i, routing_key="s")
        broker.streams.commit_all()  # one chunk per commit
    broker.streams.running = False
    c.ok(1, spec.Basic.Qos(0, 1, False), spec.Basic.QosOk)
    c.consume(1, "s", tag="a", arguments={"x-stream-offset": "first"})
    q = broker.vhosts["/"].queues["s"]
    assert q.log.message_count == 3000
    (cursor,) = q._cursors.values()
    assert len(cursor.pending) == 999  # the rest of the first chunk, nothing more


def test_stream_store_without_task_commits_at_once(tmp_path):
    store = StreamStore(str(tmp_path))
    lg = store.open("/", "x")
    lg.append_record(b"r")
    assert lg.committed_offset == 0
    lg.close()


def test_policy_sets_retention(session_client, broker):
    """apply-to streams: max-age, max-length-bytes, stream-max-segment-size-bytes reach the
    log; a lower max-length-bytes drops whole old segments at once."""
    c = session_client()
    _stream(c, "ps")
    q = broker.vhosts["/"].queues["ps"]
    broker.policies.set_policy("/", "sp", "^ps$", {"stream-max-segment-size-bytes": 2000},
                               apply_to="streams")
    assert q.policy == "sp" and q.log.max_segment_size == 2000
    for i in range(100):
        c.publish(1, b"%03d" % i + b"x" * 100, routing_key="ps")
    assert q.log.segment_count > 3 and q.log.first_offset == 0
    broker.policies.set_policy("/", "sp", "^ps$", {"stream-max-segment-size-bytes": 2000,
                                                   "max-length-bytes": 5000, "max-age": "1h"},
                               apply_to="streams")
    assert q.log.max_age == 3600 and q.log.max_bytes == 5000
    assert q.log.first_offset > 0 and q.log.size_bytes < 5000 + 2000


def test_policy_keys_validated():
    from broker.policies.validate import PolicyError, validate_definition
    with pytest.raises(PolicyError, match="is not a valid max age"):
        validate_definition({"max-age": "10X"})
    with pytest.raises(PolicyError, match="-1 is not a valid segment size"):
        validate_definition({"stream-max-segment-size-bytes": -1})
    validate_definition({"max-age": "7D", "stream-max-segment-size-bytes": 1000})


def test_confirm_waits_for_the_log_commit(session_client, broker):
    c = session_client()
    _stream(c)
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    broker.streams.running = True  # commits wait for commit_all (the group commit task's)
    written = c.publish(1, b"x", routing_key="s", delivery_mode=2)
    written += c.publish(1, b"y", routing_key="s")  # transient: waits all the same
    assert not [w for w in written if isinstance(w.method, spec.Basic.Ack)]
    q = broker.vhosts["/"].queues["s"]
    assert q.log.committed_offset == -1
    broker.streams.commit_all()
    acks = [w.method for w in c.output() if isinstance(w.method, spec.Basic.Ack)]
    assert acks and acks[-1].delivery_tag == 2
    assert q.log.committed_offset == 1
    broker.streams.running = False


def test_record_carries_amqp10_sections_for_stream_clients():
    """What a Stream-protocol client decodes from a 0-9-1 publish: header, properties,
    application-properties and data, as RabbitMQ converts them."""
    from broker.amqp.fields import decode_properties, encode_properties
    raw = encode_properties({"content_type": "text/plain", "message_id": "m1",
                             "correlation_id": "c", "reply_to": "r", "timestamp": 12345,
                             "priority": 3, "delivery_mode": 2, "headers": {"a": b"x"}})
    r = record.encode(Message("ex", "rk", raw, decode_properties(raw), b"body"))
    sections, pos = {}, 0
    while pos < len(r):
        code, pos = record._read(r, pos + 1)
        sections[code], pos = record._read(r, pos)
    assert sections[0x70] == [True, 3]
    assert sections[0x73] == ["m1", None, None, None, "r", "c", "text/plain", None, None,
                              12345000]
    assert sections[0x74] == {"a": "x"} and sections[0x75] == b"body"


def test_garbage_records_are_skipped_never_raise():
    """A record nobody can read (another client's bytes, a fuzzed one) is skipped."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from broker.amqp.fields import decode_properties, encode_properties
    raw = encode_properties({"content_type": "a", "headers": {"h": 1}, "timestamp": 5})
    good = record.encode(Message("x", "k", raw, decode_properties(raw), b"body"))

    @settings(max_examples=400, deadline=None)
    @given(st.binary(max_size=300), st.integers(0, len(good)), st.integers(0, 255))
    def check(blob, cut, flip):
        for data in (blob, good[:cut], good[:cut] + bytes([flip]) + good[cut + 1:]):
            m = StreamQueue._message(0, data, None)
            assert m is None or isinstance(m, Message)
    check()


def test_a_new_stream_does_not_inherit_old_files(session_client, broker):
    """Files left by an earlier stream of the same name (a memory store forgot its
    declaration) are not a new stream's: its log starts empty."""
    from broker.queues.types import make_queue
    c = session_client()
    _stream(c, "old")
    c.publish(1, b"stale", routing_key="old")
    vhost = broker.vhosts["/"]
    q = vhost.queues.pop("old")  # forgotten, files kept (as after a restart)
    broker.streams.forget(q.log)
    q.log.close()
    recovered = make_queue(vhost, "old", durable=True, arguments=S)
    assert recovered.message_count == 1  # recovery keeps them
    broker.streams.forget(recovered.log)
    recovered.log.close()
    fresh = make_queue(vhost, "old", fresh=True, durable=True, arguments=S)
    assert fresh.message_count == 0 and fresh.log.next_offset == 0


def test_a_filtered_consumer_far_behind_reads_in_rounds(session_client, broker, clock):
    """1,500 chunks the filter refuses, then one it wants: a dispatch skips a bounded number
    of chunks (unread past their Bloom filter) and the timer heap continues, so one
    consumer never holds the loop for the whole stream."""
    from broker.amqp.fields import encode_properties
    c = session_client()
    _stream(c)
    q = broker.vhosts["/"].queues["s"]

    def rec(body, value):
        props = {"headers": {"x-stream-filter-value": value}}
        return record.encode(Message("", "s", encode_properties(props), props, body))
    broker.streams.running = True  # one commit for all (as the group commit task would)
    for i in range(1500):
        q.log.append([rec(b"b%d" % i, "blue")], filter_values=["blue"])
    q.log.append([rec(b"wanted", "red")], filter_values=["red"])
    broker.streams.commit_all()
    broker.streams.running = False
    c.ok(1, spec.Basic.Qos(0, 10, False), spec.Basic.QosOk)
    written = c.consume(1, "s", arguments={"x-stream-offset": "first", "x-stream-filter": "red"})
    assert deliveries(written) == []  # not reached in the first round
    (cursor,) = q._cursors.values()
    assert 0 < cursor.reader.next_offset < 1500
    rounds = 0
    while not (ds := deliveries(c.output())) and rounds < 10:
        clock.advance(0)
        rounds += 1
    assert [d.body for d in ds] == [b"wanted"] and rounds >= 1


def test_tx_commit_ok_waits_for_the_log_commit(session_client, broker):
    """A transaction's commit-ok promises what a confirm does: the stream's log has the
    messages on disk (it used to answer before the log's group commit)."""
    c = session_client()
    _stream(c)
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    broker.streams.running = True  # commits wait for commit_all (the group commit task's)
    c.publish(1, b"x", routing_key="s", delivery_mode=2)
    c.publish(1, b"y", routing_key="s")
    written = c.call(1, spec.Tx.Commit())
    assert not [w for w in written if isinstance(w.method, spec.Tx.CommitOk)]
    q = broker.vhosts["/"].queues["s"]
    assert q.log.committed_offset == -1
    broker.streams.commit_all()
    assert [w for w in c.output() if isinstance(w.method, spec.Tx.CommitOk)]
    assert q.log.committed_offset == 1
    written = c.call(1, spec.Tx.Commit())  # an empty commit: answered at once
    assert [w for w in written if isinstance(w.method, spec.Tx.CommitOk)]
    broker.streams.running = False


def test_an_at_least_once_dead_letter_into_a_stream_waits_for_its_log(session_client, broker):
    """An at-least-once dead letter leaves its quorum queue once its target has it durably:
    for a stream, once the stream's log committed it (it waited for the classic store,
    which a stream's records never go to)."""
    c = session_client()
    _stream(c, "dl-s")
    c.declare_queue(1, "src", durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dl-s", "x-overflow": "reject-publish",
        "x-dead-letter-strategy": "at-least-once"})
    c.publish(1, b"dead", routing_key="src", delivery_mode=2)
    src = broker.vhosts["/"].queues["src"]
    stream = broker.vhosts["/"].queues["dl-s"]
    left: list = []

    class Ops:  # what the queue's store hears: the entry leaving
        def queue_op(self, _queue, op, _entry) -> None:
            left.append(op.name)
    src.observers.append(Ops())
    broker.streams.running = True  # commits wait for commit_all (the group commit task's)
    try:
        got = [w for w in c.call(1, spec.Basic.Get(queue="src"))
               if isinstance(w.method, spec.Basic.GetOk)]
        c.call(1, spec.Basic.Reject(delivery_tag=got[0].method.delivery_tag, requeue=False))
        assert stream.log.next_offset == 1 and stream.log.committed_offset == -1
        assert "DEAD_LETTER" not in left  # kept until the stream's log has it on disk
        broker.streams.commit_all()
        assert stream.log.committed_offset == 0
        assert left[-1] == "DEAD_LETTER" and left.count("DEAD_LETTER") == 1
    finally:
        broker.streams.running = False
