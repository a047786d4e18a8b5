"""Small helpers shared by the interop tests."""
from __future__ import annotations

import struct
import time

import pika
import pika.exceptions
import pytest

import rawamqp


def wait_for(pred, timeout=10.0, interval=0.02, conn=None, msg="condition"):
    """Poll pred() until truthy; uses conn.sleep() (pika) to keep the connection serviced."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {msg}")
        if conn is not None:
            conn.sleep(interval)
        else:
            time.sleep(interval)


def get_one(ch, queue, timeout=10.0, auto_ack=True):
    """basic.get in a loop until a message arrives; returns (method, props, body)."""
    deadline = time.monotonic() + timeout
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=auto_ack)
        if m is not None:
            return m, p, b
        if time.monotonic() > deadline:
            raise AssertionError(f"no message arrived in {queue!r} within {timeout}s")
        ch.connection.sleep(0.02)


def drain(ch, queue, auto_ack=True):
    """All messages currently in queue via basic.get."""
    out = []
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=auto_ack)
        if m is None:
            return out
        out.append((m, p, b))


def assert_empty(ch, queue, settle=0.2):
    ch.connection.sleep(settle)
    m, _, b = ch.basic_get(queue, auto_ack=True)
    assert m is None, f"expected {queue!r} to be empty, got {b!r}"


def channel_error(fn, *args, **kw):
    """Run fn and return (code, text) of the resulting ChannelClosedByBroker."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        fn(*args, **kw)
    return ei.value.reply_code, ei.value.reply_text


def connection_error(fn, *args, **kw):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        fn(*args, **kw)
    return ei.value.reply_code, ei.value.reply_text


def assert_channel_error(code, text_prefix, fn, *args, **kw):
    got_code, got_text = channel_error(fn, *args, **kw)
    assert (got_code, got_text[: len(text_prefix)]) == (code, text_prefix), (got_code, got_text)
    return got_text


def assert_connection_error(code, text_prefix, fn, *args, **kw):
    got_code, got_text = connection_error(fn, *args, **kw)
    assert (got_code, got_text[: len(text_prefix)]) == (code, text_prefix), (got_code, got_text)
    return got_text


def consume_n(conn, ch, queue, n, timeout=10.0, auto_ack=True, **kw):
    """Consume n messages with basic.consume; returns list of (method, props, body)."""
    got = []

    def cb(c, m, p, b):
        got.append((m, p, b))

    tag = ch.basic_consume(queue, cb, auto_ack=auto_ack, **kw)
    deadline = time.monotonic() + timeout
    while len(got) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)}/{n} messages consumed from {queue!r}")
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def raw_get(r, queue, timeout=10.0):
    """basic.get (no-ack) on a raw connection's channel 1 until a message arrives; returns
    (typed properties, body)."""
    deadline = time.monotonic() + timeout
    while True:
        r.send_method(1, rawamqp.BASIC_GET, struct.pack(">H", 0) + rawamqp.shortstr(queue) + b"\x01")
        _, cm, _ = r.read_method()
        if cm == rawamqp.BASIC_GET_OK:
            break
        assert cm == rawamqp.BASIC_GET_EMPTY, cm
        assert time.monotonic() < deadline, f"no message in {queue!r}"
        time.sleep(0.05)
    ftype, _, payload = r.read_frame()
    assert ftype == rawamqp.FRAME_HEADER
    props = rawamqp.parse_basic_properties(payload, typed=True)
    body = b""
    while len(body) < props["_body_size"]:
        ftype, _, chunk = r.read_frame()
        assert ftype == rawamqp.FRAME_BODY
        body += chunk
    return props, body
