"""Property-based robustness tests: no input may make the sans-IO layer raise.

Any exception escaping ``ServerConnection.receive_data`` or an unexpected
exception type from ``decode_table`` is a bug, not something to filter out.
"""
from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.amqp.codec import HEARTBEAT_FRAME, FrameReader
from broker.amqp.events import ConnectionCloseCompleted, ConnectionClosedByPeer, ContentReceived, State
from broker.amqp.fields import FieldError, decode_properties, decode_table

from .sansio_helpers import (
    HEADER,
    body_frame,
    conn_open,
    header_frame,
    make_conn,
    mframe,
    open_connection,
    publish,
    start_ok,
    tune_ok,
)

# SANSIO_FUZZ_EXAMPLES=20000 for a long local fuzzing run; 300 keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("SANSIO_FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

ALLOWED_DECODE_ERRORS = (FieldError, ValueError, IndexError, struct.error)


def check_output(conn, written: bytearray):
    """Everything the server wrote parses as whole frames with decodable methods."""
    written += conn.data_to_send()
    frames = FrameReader(frame_max=0).feed(bytes(written))
    methods = [spec.decode_method(p) for t, _, p in frames if t == spec.FRAME_METHOD]
    return methods


def check_end_state(conn, events, methods):
    """Either still open, or closing/closed for a reason that was communicated."""
    if conn.state is State.OPEN:
        return
    assert conn.state in (State.CLOSING, State.CLOSED)
    closes = [m for m in methods if isinstance(m, spec.Connection.Close)]
    if closes:
        assert closes[-1].reply_code in spec.HARD_ERRORS, closes[-1]
        assert len(closes) == 1
        return
    # The client itself closed (close -> we answered close-ok) or sent close-ok.
    assert any(isinstance(e, (ConnectionClosedByPeer, ConnectionCloseCompleted)) for e in events), events
    if any(isinstance(e, ConnectionClosedByPeer) for e in events):
        # The connection leaves the close-ok to the broker (confirms owed go first).
        assert not any(isinstance(m, spec.Connection.CloseOk) for m in methods)
        conn.accept_close()
        assert isinstance(check_output(conn, bytearray())[-1], spec.Connection.CloseOk)


# ---- (a) random bytes after a valid handshake -----------------------------------

@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_after_handshake(chunks):
    conn = open_connection(channels=[1])
    written = bytearray()
    events = []
    for chunk in chunks:
        events += conn.receive_data(chunk)  # must never raise
    check_end_state(conn, events, check_output(conn, written))


def _frame_prefix(ftype, channel, size):
    return struct.pack(">BHI", ftype, channel, size)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 8, 0, 4, 255]), st.sampled_from([0, 1, 2, 3]),
                          st.binary(max_size=40)), max_size=10))
def test_random_payloads_in_well_formed_frames(frames):
    """Random payloads wrapped in correct framing reach the method/content layers."""
    conn = open_connection(channels=[1, 2])
    data = b"".join(_frame_prefix(t, ch, len(p)) + p + b"\xce" for t, ch, p in frames)
    events = conn.receive_data(data)
    check_end_state(conn, events, check_output(conn, bytearray()))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(sorted(spec.METHODS)), st.sampled_from([0, 1, 2]),
                          st.binary(max_size=30)), max_size=8))
def test_known_method_ids_with_random_arguments(methods):
    conn = open_connection(channels=[1])
    data = b"".join(mframe_raw(ch, struct.pack(">HH", *key) + args) for key, ch, args in methods)
    events = conn.receive_data(data)
    check_end_state(conn, events, check_output(conn, bytearray()))


def mframe_raw(channel, payload):
    return _frame_prefix(1, channel, len(payload)) + payload + b"\xce"


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_during_handshake(data):
    for prefix in (b"", HEADER, HEADER + start_ok(), HEADER + start_ok() + tune_ok()):
        conn = make_conn()
        events = conn.receive_data(prefix + data)
        assert conn.state in set(State)
        check_output(conn, bytearray())
        del events


# ---- (b) mutated valid traffic -------------------------------------------------------

VALID_TRAFFIC = b"".join([
    mframe(1, spec.Exchange.Declare(0, "ex", "topic", False, True, False, False, False,
                                    {"alternate-exchange": "ae", "n": [1, 2.5, None]})),
    mframe(1, spec.Queue.Declare(0, "q", False, True, False, False, False, {"x-max-length": 10})),
    mframe(1, spec.Queue.Bind(0, "q", "ex", "a.#", False, {})),
    publish(1, b"hello world", "ex", "a.b",
            {"content_type": "text/plain", "headers": {"h": {"x": [b"y"]}}, "priority": 3,
             "timestamp": 12345}, chunks=3),
    publish(1, b"", "ex", "a.c"),
    mframe(1, spec.Basic.Consume(0, "q", "ctag", False, False, False, False, {})),
    mframe(1, spec.Basic.Ack(1, True)),
    HEARTBEAT_FRAME,
    mframe(2, spec.Channel.Open()),
    mframe(2, spec.Basic.Qos(0, 10, False)),
    mframe(2, spec.Channel.Close(200, "bye", 0, 0)),
    mframe(0, spec.Connection.UpdateSecret(b"secret", "why")),
    mframe(1, spec.Tx.Select()),
    header_frame(3, 1),
    body_frame(1, b"stray"),
])


@st.composite
def mutated(draw, base=VALID_TRAFFIC):
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "length", "byte"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        else:  # overwrite 1, 2 or 4 octets with a random length-like number
            width = draw(st.sampled_from([1, 2, 4]))
            value = draw(st.integers(0, 256 ** width - 1))
            data[pos:pos + width] = value.to_bytes(width, "big")
    return bytes(data)


@FUZZ
@given(mutated(), st.integers(1, 64))
def test_mutated_traffic_never_raises(data, chunk):
    conn = open_connection(channels=[1])
    written = bytearray()
    events = []
    for i in range(0, len(data), chunk):
        events += conn.receive_data(data[i:i + chunk])
    methods = check_output(conn, written)
    check_end_state(conn, events, methods)
    if conn.state is State.OPEN:
        # Still usable: a client close is answered.
        events = conn.receive_data(mframe(0, spec.Connection.Close(200, "", 0, 0)))
        if any(isinstance(e, ConnectionClosedByPeer) for e in events):
            assert conn.state is State.CLOSED


def test_unmutated_traffic_is_valid():
    conn = open_connection(channels=[1])
    events = conn.receive_data(VALID_TRAFFIC[:-len(header_frame(3, 1) + body_frame(1, b"stray"))])
    assert conn.is_open
    assert [e.body for e in events if isinstance(e, ContentReceived)] == [b"hello world", b""]


HANDSHAKE = HEADER + start_ok() + tune_ok() + conn_open() + mframe(1, spec.Channel.Open())


@FUZZ
@given(mutated(HANDSHAKE + VALID_TRAFFIC[:300]))
def test_mutated_handshake_never_raises(data):
    conn = make_conn()
    events = conn.receive_data(data)
    methods = check_output(conn, bytearray())
    if conn.state in (State.CLOSING, State.CLOSED) and not methods:
        # Only a bad protocol header or a refused login closes without a connection.close.
        assert events and isinstance(events[-1], ConnectionCloseCompleted)


# ---- (c) decode_table / decode_properties on random input -------------------------

@FUZZ
@given(st.binary(max_size=300))
@example(b"\x00\x00\x00\x05\x01kF\x00\x00")
@example(b"\x00\x00\x00\x06\x01kS\xff\xff\xff\xff")
def test_decode_table_random(data):
    try:
        decode_table(data, 0)
    except ALLOWED_DECODE_ERRORS:
        pass


@st.composite
def table_like(draw):
    """Random but table-shaped bytes: plausible tags and lengths, so deeper paths run."""
    def value(depth):
        tag = draw(st.sampled_from(list(b"tbBsuIilLfdDSATFVxZ")))
        if tag in b"AF" and depth < 4:
            n = draw(st.integers(0, 3))
            items = b"".join((b"\x01k" if tag == ord("F") else b"") + value(depth + 1) for _ in range(n))
            length = len(items) + draw(st.sampled_from([0, 0, 0, -1, 1, 2**31]))
            return bytes([tag]) + (length % 2**32).to_bytes(4, "big") + items
        if tag in b"Sx":
            payload = draw(st.binary(max_size=6))
            length = len(payload) + draw(st.sampled_from([0, 0, 1, -1, 2**32 - 1]))
            return bytes([tag]) + (length % 2**32).to_bytes(4, "big") + payload
        return bytes([tag]) + draw(st.binary(max_size=9))

    body = b"".join(bytes([1]) + b"k" + value(0) for _ in range(draw(st.integers(0, 4))))
    length = len(body) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    return (length % 2**32).to_bytes(4, "big") + body


@FUZZ
@given(table_like())
def test_decode_table_structured(data):
    try:
        decode_table(data, 0)
    except ALLOWED_DECODE_ERRORS:
        pass


@FUZZ
@given(st.binary(max_size=120))
@example(b"\x00\x01")
def test_decode_properties_random(data):
    try:
        decode_properties(data)
    except FieldError:
        pass


@FUZZ
@given(st.binary(max_size=100))
def test_decode_method_random(data):
    for key in ((50, 10), (60, 20), (10, 11), (40, 10)):
        try:
            spec.decode_method(struct.pack(">HH", *key) + data)
        except spec.MethodDecodeError:
            pass
