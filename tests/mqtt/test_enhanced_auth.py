"""MQTT 5 enhanced authentication, sans-IO: the PLAIN method's parsing and the
connection's handling of AUTH (re-authentication, a method other than the CONNECT's, an
AUTH when none was agreed)."""
from __future__ import annotations

import pytest

from broker.mqtt import codec as m
from broker.mqtt import properties as P
from broker.mqtt.codec import PacketReader, encode
from broker.mqtt.connection import (
    ConnectRequested,
    ProtocolViolation,
    ReauthRequested,
    ServerConnection,
)
from broker.mqtt.enhanced_auth import METHODS, Credentials, Refused


@pytest.mark.parametrize("data, expected", [
    (b"\x00guest\x00secret", Credentials("guest", "secret")),
    (b"guest\x00guest\x00secret", Credentials("guest", "secret")),
    (b"\x00vh:bob\x00p\xc3\xa4ss", Credentials("vh:bob", "p\u00e4ss")),
    (b"\x00guest\x00", Credentials("guest", "")),
])
def test_plain_credentials(data, expected):
    assert METHODS["PLAIN"].start(data) == expected


@pytest.mark.parametrize("data", [b"", b"guest", b"\x00guest", b"\x00\x00pw",
                                  b"a\x00b\x00c\x00d", b"\x00gu\xffest\x00pw",
                                  b"alice\x00bob\x00pw"])
def test_plain_refusals(data):
    assert isinstance(METHODS["PLAIN"].start(data), Refused)


def _reader() -> PacketReader:
    r = PacketReader()
    r.version, r.started = 5, True
    return r


def _connected(method: str | None) -> ServerConnection:
    conn = ServerConnection()
    props = {P.AUTHENTICATION_METHOD: method} if method else {}
    [ev] = conn.receive_data(encode(m.Connect("c", True, 30, protocol_level=5,
                                              properties=props)))
    assert isinstance(ev, ConnectRequested)
    conn.auth_method = method
    conn.accept(False, "guest", {})
    conn.data_to_send()
    return conn


def _auth(code: int, method: str = "PLAIN", data: bytes = b"d") -> bytes:
    return encode(m.Disconnect(code, {P.AUTHENTICATION_METHOD: method,
                                      P.AUTHENTICATION_DATA: data}, m.AUTH))


def test_reauth_event_and_answer():
    conn = _connected("PLAIN")
    assert conn.receive_data(_auth(P.REAUTHENTICATE, data=b"xyz")) == [ReauthRequested(b"xyz")]
    conn.auth_success()
    [a] = _reader().feed(conn.data_to_send())
    assert a == m.Disconnect(0, {P.AUTHENTICATION_METHOD: "PLAIN"}, m.AUTH)


@pytest.mark.parametrize("method, packet", [
    ("PLAIN", _auth(P.REAUTHENTICATE, method="OTHER")),
    ("PLAIN", _auth(P.CONTINUE_AUTHENTICATION)),
    ("PLAIN", _auth(P.SUCCESS)),
    (None, _auth(P.REAUTHENTICATE)),
])
def test_auth_violations(method, packet):
    conn = _connected(method)
    [ev] = conn.receive_data(packet)
    assert isinstance(ev, ProtocolViolation)
    [d] = _reader().feed(conn.data_to_send())
    assert (d.type, d.reason_code) == (m.DISCONNECT, P.PROTOCOL_ERROR)
