"""Shared helpers for the sans-IO AMQP unit tests: frame builders, a fake
authenticator, a handshake driver and decoders for what the server wrote."""
from __future__ import annotations

import struct

from broker.amqp import spec
from broker.amqp.codec import FrameReader, method_frame
from broker.amqp.connection import ServerConnection
from broker.amqp.events import State
from broker.amqp.fields import decode_table, encode_properties, encode_table

HEADER = spec.PROTOCOL_HEADER

GUEST_PLAIN = b"\x00guest\x00guest"
# AMQPLAIN responses are a field table without its 4-byte length prefix.
GUEST_AMQPLAIN = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]

REFUSAL = "Login was refused using authentication mechanism PLAIN."  # what an authenticator says
REFUSED = "ACCESS_REFUSED - " + REFUSAL  # what the client is sent


class FakeAuth:
    """Accepts guest/guest over PLAIN and AMQPLAIN; records every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, mechanism: str, response: bytes):
        self.calls.append((mechanism, response))
        user = password = None
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) == 3:
                user, password = parts[1], parts[2]
        elif mechanism == "AMQPLAIN":
            try:
                table, _ = decode_table(struct.pack(">I", len(response)) + response, 0)
            except Exception:
                table = {}
            user, password = table.get("LOGIN"), table.get("PASSWORD")
        if (user, password) == (b"guest", b"guest"):
            return "guest", ""
        return None, REFUSAL


def make_conn(**kwargs) -> ServerConnection:
    auth = kwargs.pop("authenticate", None) or FakeAuth()
    vhosts = kwargs.pop("vhosts", {"/"})
    return ServerConnection(auth, lambda v: v in vhosts, **kwargs)


# ---- frame builders -----------------------------------------------------------

def raw_frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def mframe(channel: int, method: spec.Method) -> bytes:
    return method_frame(channel, method)


def header_frame(channel: int, body_size: int, props: dict | None = None, class_id: int = 60) -> bytes:
    payload = struct.pack(">HHQ", class_id, 0, body_size) + encode_properties(props or {})
    return raw_frame(spec.FRAME_HEADER, channel, payload)


def body_frame(channel: int, data: bytes) -> bytes:
    return raw_frame(spec.FRAME_BODY, channel, data)


def heartbeat_frame(channel: int = 0) -> bytes:
    return raw_frame(spec.FRAME_HEARTBEAT, channel, b"")


def publish(channel: int, body: bytes, exchange: str = "", routing_key: str = "rk",
            props: dict | None = None, chunks: int = 1) -> bytes:
    out = mframe(channel, spec.Basic.Publish(0, exchange, routing_key, False, False))
    out += header_frame(channel, len(body), props)
    if body:
        step = max(1, -(-len(body) // chunks))
        for i in range(0, len(body), step):
            out += body_frame(channel, body[i:i + step])
    return out


def start_ok(mechanism: str = "PLAIN", response: bytes = GUEST_PLAIN, capabilities: dict | None = None):
    props = {"product": "unit-test"}
    if capabilities is not None:
        props["capabilities"] = capabilities
    return mframe(0, spec.Connection.StartOk(props, mechanism, response, "en_US"))


def tune_ok(channel_max: int = 2047, frame_max: int = 131072, heartbeat: int = 60):
    return mframe(0, spec.Connection.TuneOk(channel_max, frame_max, heartbeat))


def conn_open(vhost: str = "/"):
    return mframe(0, spec.Connection.Open(vhost, "", False))


# ---- decoding what the server wrote ----------------------------------------

def parse_frames(data: bytes) -> list:
    reader = FrameReader(frame_max=0)
    frames = reader.feed(data)
    assert reader.buffered == 0, "server wrote a partial frame"
    return frames


def written_methods(data: bytes) -> list:
    """[(channel, method)] for every method frame in ``data`` (other frames skipped)."""
    return [(ch, spec.decode_method(p)) for t, ch, p in parse_frames(data) if t == spec.FRAME_METHOD]


def drain_methods(conn: ServerConnection) -> list:
    return written_methods(conn.data_to_send())


def only_method(conn: ServerConnection):
    methods = drain_methods(conn)
    assert len(methods) == 1, methods
    return methods[0]


def open_connection(conn: ServerConnection | None = None, channels=(), **kwargs) -> ServerConnection:
    """Run the whole handshake (and open ``channels``), leaving nothing to send."""
    conn = conn or make_conn(**kwargs)
    conn.receive_data(HEADER)
    conn.receive_data(start_ok())
    conn.receive_data(tune_ok())
    conn.receive_data(conn_open())
    assert conn.state is State.OPEN
    for ch in channels:
        conn.receive_data(mframe(ch, spec.Channel.Open()))
        assert conn.channel_is_open(ch)
    conn.data_to_send()
    return conn


def assert_connection_closed_with(conn: ServerConnection, code: int, class_id=None, method_id=None):
    methods = drain_methods(conn)
    closes = [m for ch, m in methods if isinstance(m, spec.Connection.Close)]
    assert closes, f"no connection.close written: {methods}"
    close = closes[-1]
    assert close.reply_code == code, close
    assert close.reply_text.startswith(spec.REPLY_NAMES[code]), close
    if class_id is not None:
        assert (close.class_id, close.method_id) == (class_id, method_id), close
    assert conn.state in (State.CLOSING, State.CLOSED)
    return close
