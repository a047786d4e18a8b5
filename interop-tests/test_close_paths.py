"""Closing handshakes and idempotent operations, as real clients exercise them.

- Everything owed on a channel (publisher confirms) is written before its close-ok, and
  nothing follows a close-ok on that channel.
- After connection.close-ok the broker keeps reading (and discarding) until the client
  closes its end: a client that still has publishes in flight gets its close-ok, not a reset.
- A reply whose content is empty is flushed like any other (basic.get-ok, deliver, return,
  dead-lettered messages).
- Unbinding or deleting what does not exist is not an error, as in RabbitMQ 3.x.
"""
from __future__ import annotations

import struct
import threading
import time

import pika
import pytest
from helpers import assert_channel_error, get_one

import rawamqp
from rawamqp import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET,
    BASIC_GET_OK,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    Reader,
    method_frame,
    shortstr,
)

BASIC_NACK = (60, 120)
BASIC_RETURN = (60, 50)


def _method(payload: bytes):
    r = Reader(payload)
    return (r.short(), r.short()), r


def _read_frames_until(raw, stop, timeout=5.0):
    """Frames up to and including the first one for which stop(frame) is true."""
    frames = []
    deadline = time.monotonic() + timeout
    while True:
        f = raw.read_frame(max(0.1, deadline - time.monotonic()))
        frames.append(f)
        if stop(f):
            return frames


def _is_method(f, cm, channel=None):
    return f[0] == FRAME_METHOD and _method(f[2])[0] == cm and (channel is None or f[1] == channel)


def _acked_tags(frames, channel):
    """Delivery tags confirmed by basic.ack frames on channel (expanding multiple=true)."""
    acked: set[int] = set()
    for ftype, ch, payload in frames:
        if ftype != FRAME_METHOD or ch != channel:
            continue
        cm, r = _method(payload)
        if cm in (BASIC_ACK, BASIC_NACK):
            tag = r.longlong()
            multiple = r.octet() & 1
            acked |= set(range(1, tag + 1)) if multiple else {tag}
    return acked


# ------------------------------------------------------- confirms before close-ok
@pytest.mark.parametrize("count", [1, 200])
def test_confirms_are_written_before_channel_close_ok(raw_conn, count):
    """confirm.select, publishes and channel.close in one write: every ack precedes close-ok
    and nothing arrives on the channel after it (a client reusing the number must not see a
    stray basic.ack)."""
    raw_conn.confirm_select(1)
    data = b""
    for _i in range(count):
        data += method_frame(1, rawamqp.BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("")
                             + shortstr("itest-no-such-queue") + b"\x00")
        data += rawamqp.content_header(1, 1) + rawamqp.body_frame(1, b"x")
    data += method_frame(1, CHANNEL_CLOSE, struct.pack(">H", 200) + shortstr("bye")
                         + struct.pack(">HH", 0, 0))
    raw_conn.send(data)
    frames = _read_frames_until(raw_conn, lambda f: _is_method(f, CHANNEL_CLOSE_OK, 1))
    assert _acked_tags(frames, 1) == set(range(1, count + 1))
    # Reuse the channel number: the next frame on it must be the new open-ok, no stray ack.
    raw_conn.send_method(1, rawamqp.CHANNEL_OPEN, shortstr(""))
    raw_conn.expect(rawamqp.CHANNEL_OPEN_OK, 1, timeout=3)
    raw_conn.queue_declare(1, "", exclusive=True)


def test_confirms_are_written_before_connection_close_ok(raw_conn):
    raw_conn.confirm_select(1)
    data = b""
    for _ in range(100):
        data += method_frame(1, rawamqp.BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("")
                             + shortstr("itest-no-such-queue") + b"\x00")
        data += rawamqp.content_header(1, 0)
    data += method_frame(0, CONNECTION_CLOSE, struct.pack(">H", 200) + shortstr("bye")
                         + struct.pack(">HH", 0, 0))
    raw_conn.send(data)
    frames = _read_frames_until(raw_conn, lambda f: _is_method(f, CONNECTION_CLOSE_OK, 0))
    assert sum(_is_method(f, CONNECTION_CLOSE_OK) for f in frames) == 1
    # After close-ok: nothing but the end of the stream once we close our side.
    raw_conn.sock.shutdown(1)
    assert raw_conn.read_until_closed(5.0) == b""


def test_pika_confirms_then_close_in_one_burst(connect, uid, cleanup):
    """pika: publish with confirms, close the channel, reopen and use the same number."""
    conn = connect()
    ch = conn.channel()
    number = ch.channel_number
    ch.queue_declare(cleanup.queue(uid))
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", uid, str(i).encode())
    ch.close()
    again = conn.channel(channel_number=number)
    assert again.queue_declare(uid, passive=True).method.message_count == 50


# ------------------------------------------------------- linger after close-ok
def test_client_still_writing_after_close_gets_close_ok_not_reset(raw_socket, amqp_params):
    """The client sends connection.close and keeps writing (publishes still leaving its
    buffer). The broker answers close-ok and reads on until the client closes: the client's
    writes never fail and its read of close-ok never sees a reset."""
    raw = raw_socket(timeout=10)
    raw.handshake(vhost=amqp_params.vhost)
    raw.channel_open(1)
    publish = (method_frame(1, rawamqp.BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("")
                            + shortstr("itest-nowhere") + b"\x00")
               + rawamqp.content_header(1, 4096) + rawamqp.body_frame(1, b"p" * 4096))
    close = method_frame(0, CONNECTION_CLOSE, struct.pack(">H", 200) + shortstr("bye")
                         + struct.pack(">HH", 0, 0))
    raw.send(publish * 50 + close)
    errors: list[BaseException] = []

    def keep_writing():
        try:
            for _ in range(40):  # ~ 0.8 s of traffic after the close
                raw.sock.sendall(publish * 10)
                time.sleep(0.02)
        except OSError as exc:
            errors.append(exc)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        frames = _read_frames_until(raw, lambda f: _is_method(f, CONNECTION_CLOSE_OK, 0),
                                    timeout=10)
    finally:
        writer.join(10)
    assert _is_method(frames[-1], CONNECTION_CLOSE_OK, 0)
    assert not errors, f"writes after close failed: {errors!r}"
    raw.sock.shutdown(2)


# ------------------------------------------------------- empty bodies are flushed
def _raw_get(raw, queue, channel=1, timeout=3.0):
    raw.send_method(channel, BASIC_GET, struct.pack(">H", 0) + shortstr(queue) + b"\x01")
    ch, cm, r = raw.read_method(timeout)
    assert cm == BASIC_GET_OK, cm
    ftype, _, payload = raw.read_frame(timeout)
    assert ftype == FRAME_HEADER
    size = struct.unpack(">Q", payload[4:12])[0]
    body = b""
    while len(body) < size:
        ftype, _, chunk = raw.read_frame(timeout)
        assert ftype == FRAME_BODY
        body += chunk
    return body


def test_basic_get_of_empty_body_is_answered_at_once(raw_conn):
    q, _, _ = raw_conn.queue_declare(1, "", exclusive=True)
    raw_conn.publish(1, "", q, b"")
    raw_conn.publish(1, "", q, b"")
    # No other traffic: the get-ok must not wait for a heartbeat or another frame.
    assert _raw_get(raw_conn, q) == b""
    assert _raw_get(raw_conn, q) == b""


def test_empty_body_consume_and_get_with_pika(ch, uid, cleanup):
    ch.queue_declare(cleanup.queue(uid))
    for _ in range(3):
        ch.basic_publish("", uid, b"")
    m, _, body = get_one(ch, uid)
    assert body == b""
    got = []
    ch.basic_consume(uid, lambda c, m, p, b: got.append(b), auto_ack=True)
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        ch.connection.process_data_events(0.05)
    assert got == [b"", b""]


def test_empty_body_return_is_flushed(raw_conn):
    raw_conn.publish(1, "", "itest-no-such-queue-empty", b"", mandatory=True)
    ch, cm, r = raw_conn.read_method(3.0)
    assert cm == BASIC_RETURN
    assert (r.short(), r.shortstr()) == (312, "NO_ROUTE")
    ftype, _, payload = raw_conn.read_frame(3.0)
    assert ftype == FRAME_HEADER and struct.unpack(">Q", payload[4:12])[0] == 0


def test_empty_body_dead_lettered_then_got(raw_conn, connect, uid, cleanup):
    ch = connect().channel()
    dlq = cleanup.queue(uid + "-dlq")
    src = cleanup.queue(uid)
    ch.queue_declare(dlq)
    ch.queue_declare(src, arguments={"x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": dlq, "x-message-ttl": 0})
    raw_conn.publish(1, "", src, b"")
    deadline = time.monotonic() + 5
    while ch.queue_declare(dlq, passive=True).method.message_count < 1:
        assert time.monotonic() < deadline, "message was not dead-lettered"
        ch.connection.sleep(0.02)
    assert _raw_get(raw_conn, dlq) == b""


def test_empty_body_scheduled_then_delivered(raw_conn, connect, uid, cleanup, external_broker):
    """An empty body fired by the scheduler (a timer, outside any client's read) reaches a
    waiting consumer at once. RabbitMQ ignores AMQ_SCHEDULED_DELAY and delivers it now."""
    q = cleanup.queue(uid)
    ch = connect().channel()
    ch.queue_declare(q)
    raw_conn.basic_consume(1, q, tag="c", no_ack=True)
    t0 = time.monotonic()
    ch.basic_publish("", q, b"", pika.BasicProperties(headers={"AMQ_SCHEDULED_DELAY": 300}))
    _, cm, _ = raw_conn.read_method(5.0)
    assert cm == BASIC_DELIVER
    ftype, _, payload = raw_conn.read_frame(1.0)
    assert ftype == FRAME_HEADER and struct.unpack(">Q", payload[4:12])[0] == 0
    if not external_broker:
        assert time.monotonic() - t0 >= 0.3


# ------------------------------------------------------- idempotent operations
def test_queue_unbind_is_idempotent(ch, uid, cleanup):
    ch.queue_declare(cleanup.queue(uid), auto_delete=True)
    ch.queue_unbind(uid + "-missing", "amq.direct", "k")  # missing queue
    ch.queue_unbind(uid, uid + "-missing-x", "k")  # missing exchange
    ch.queue_unbind(uid + "-missing", uid + "-missing-x", "k")  # both
    ch.queue_unbind(uid, "amq.direct", "never-bound")  # missing binding
    assert ch.is_open


def test_queue_unbind_after_auto_delete_queue_went(connect, uid):
    """An RPC helper's auto-delete reply queue is gone by the time its clean-up unbinds."""
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare(uid, auto_delete=True).method.queue
    ch.queue_bind(q, "amq.topic", "rpc.#")
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)  # last consumer gone: the queue is deleted
    ch.queue_unbind(q, "amq.topic", "rpc.#")
    assert ch.is_open


def test_exchange_unbind_is_idempotent(ch, uid, cleanup):
    ch.exchange_declare(cleanup.exchange(uid), "fanout", auto_delete=False)
    ch.exchange_unbind(uid, uid + "-missing", "k")  # missing source
    ch.exchange_unbind(uid + "-missing", uid, "k")  # missing destination
    ch.exchange_unbind(uid + "-a", uid + "-b", "k")  # both
    ch.exchange_unbind(uid, "amq.fanout", "never-bound")
    assert ch.is_open


def test_unbind_default_exchange_still_refused(ch, uid, cleanup):
    ch.queue_declare(cleanup.queue(uid), auto_delete=True)
    assert_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.queue_unbind, uid, "", uid)


def test_exchange_unbind_from_default_refused_even_if_missing(connect, uid):
    ch = connect().channel()
    assert_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_unbind, uid + "-missing", "", "k")
    ch = connect().channel()
    assert_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_unbind, "", "amq.direct", "k")


def test_unbind_of_another_connections_exclusive_queue(connect, uid):
    owner = connect().channel()
    q = owner.queue_declare(uid, exclusive=True).method.queue
    owner.queue_bind(q, "amq.direct", uid)
    other = connect().channel()
    other.queue_unbind(q, "amq.direct", uid + "-not-bound")  # no binding: nothing to refuse
    other.queue_unbind(q, uid + "-missing-x", uid)
    assert_channel_error(405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                              f"'{q}' in vhost '/'", other.queue_unbind, q, "amq.direct", uid)
    other = connect().channel()
    other.basic_publish("amq.direct", uid, b"x")
    owner.connection.sleep(0.2)
    assert owner.queue_declare(q, passive=True).method.message_count == 1


@pytest.mark.parametrize("if_unused,if_empty", [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_delete_of_missing_queue_and_exchange(ch, uid, if_unused, if_empty):
    assert ch.queue_delete(uid, if_unused=if_unused, if_empty=if_empty).method.message_count == 0
    ch.exchange_delete(uid, if_unused=if_unused)
    assert ch.is_open


def test_cancel_of_unknown_consumer_tag(ch, uid):
    ch.basic_cancel(uid + "-no-such-tag")
    assert ch.is_open


def test_purge_of_missing_queue_is_404(ch, uid):
    # Not idempotent in RabbitMQ: purge needs the queue.
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_purge, uid)


@pytest.mark.parametrize("name", ["amq.direct", "amq.itest-missing"])
def test_delete_of_system_exchange(ch, name):
    assert_channel_error(
        403, f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not allowed",
        ch.exchange_delete, name)


def test_queue_ops_with_pika_after_delete_keep_channel_usable(ch, uid):
    """The usual shutdown sequence of an RPC client on a queue that is already gone."""
    q = ch.queue_declare(uid, auto_delete=True).method.queue
    ch.queue_bind(q, "amq.direct", "rk")
    ch.queue_delete(q)
    ch.queue_unbind(q, "amq.direct", "rk")
    ch.queue_delete(q)
    ch.exchange_unbind(uid + "-x", "amq.direct", "rk")
    assert ch.queue_declare("", exclusive=True).method.queue
    assert isinstance(ch, pika.adapters.blocking_connection.BlockingChannel)
