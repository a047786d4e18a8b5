"""MQTT 5 enhanced authentication, sans-IO: the PLAIN method's parsing, SCRAM-SHA-256's
exchange against a client written here from RFC 5802, and the connection's handling of
AUTH (a challenge round while connecting and re-authenticating, re-authentication, a
method other than the CONNECT's, an AUTH when none was agreed)."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from broker.mqtt import codec as m
from broker.mqtt import properties as P
from broker.mqtt.codec import PacketReader, encode
from broker.mqtt.connection import ServerConnection
from broker.mqtt.enhanced_auth import (
    METHODS,
    Challenge,
    Credentials,
    NotOffered,
    Refused,
    Verified,
)
from broker.mqtt.events import (
    AuthContinued,
    ConnectRequested,
    ProtocolViolation,
    ReauthRequested,
)


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


# ---- SCRAM-SHA-256 (RFC 5802/7677): the client side written here from the RFC ----

def _salted(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def _lookup_for(users: dict[str, str], iterations: int = 4096):
    """A user directory as the broker's ``scram_lookup``: name -> password (None: a user
    without SCRAM credentials)."""
    from broker.security.passwords import scram_credentials, scram_tuple

    made = {u: scram_tuple(scram_credentials(p, b"salt-of-" + u.encode(), iterations))
            for u, p in users.items() if p is not None}
    return lambda name: made.get(name)


class ScramClient:
    def __init__(self, user: str, password: str, nonce: str = "rOprNGfwEbeRWgbNEkqO"):
        self.user, self.password, self.nonce = user, password, nonce
        self.bare = f"n={user},r={nonce}"

    def first(self) -> bytes:
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce) and len(attrs["r"]) > len(self.nonce)
        salted = _salted(self.password, base64.b64decode(attrs["s"]), int(attrs["i"]))
        without_proof = "c=biws,r=" + attrs["r"]
        auth = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.expected_final = b"v=" + base64.b64encode(
            hmac.new(server_key, auth, hashlib.sha256).digest())
        return (without_proof + ",p=" + base64.b64encode(proof).decode()).encode()


def _scram(lookup, client: ScramClient):
    outcome = METHODS["SCRAM-SHA-256"].start(client.first(), lookup)
    assert isinstance(outcome, Challenge), outcome
    return outcome.step.next(client.final(outcome.data))


def test_scram_exchange_proves_the_password_both_ways():
    lookup = _lookup_for({"user": "pencil", "vh:bob": None, "bob": "pw"})
    client = ScramClient("user", "pencil")
    result = _scram(lookup, client)
    assert result == Verified("user", client.expected_final)
    # 'vhost:user' names the user after the colon, as MQTT user names do here
    assert isinstance(_scram(lookup, ScramClient("vh:bob", "pw")), Verified)
    assert isinstance(_scram(lookup, ScramClient("user", "wrong")), Refused)


def test_scram_user_without_credentials_is_not_offered():
    lookup = _lookup_for({"hashed": None})
    assert isinstance(METHODS["SCRAM-SHA-256"].start(b"n,,n=hashed,r=abc", lookup), NotOffered)


@pytest.mark.parametrize("first", [
    b"", b"n,,", b"p=tls-unique,,n=user,r=abc", b"x,,n=user,r=abc", b"n,,r=abc,n=user",
    b"n,,n=user,r=abc,m=ext", b"n,,n=us=2Xer,r=abc", b"n,,n=,r=abc", b"n,a=other,n=user,r=abc",
    b"n,,n=user,r=", b"n,,n=user,r=a,b", b"n,,n=u\xffser,r=abc"])
def test_scram_client_first_refusals(first):
    lookup = _lookup_for({"user": "pencil"})
    assert isinstance(METHODS["SCRAM-SHA-256"].start(first, lookup), Refused)


def test_scram_client_final_refusals():
    lookup = _lookup_for({"user": "pencil"})
    client = ScramClient("user", "pencil")
    outcome = METHODS["SCRAM-SHA-256"].start(client.first(), lookup)
    good = client.final(outcome.data).decode()
    without, proof = good.rsplit(",p=", 1)
    for bad in (without,                                       # no proof
                "c=eSws," + without.split(",", 1)[1] + ",p=" + proof,  # other gs2 header
                without + "x,p=" + proof,                      # other nonce
                without + ",p=" + proof[:-4],                  # short proof
                without + ",p=!!!!"):                          # not base64
        assert isinstance(outcome.step.next(bad.encode()), Refused), bad
    assert isinstance(outcome.step.next(good.encode()), Verified)


def test_connection_challenge_round_while_connecting():
    conn = ServerConnection()
    props = {P.AUTHENTICATION_METHOD: "SCRAM-SHA-256", P.AUTHENTICATION_DATA: b"n,,n=u,r=x"}
    [ev] = conn.receive_data(encode(m.Connect("c", True, 30, protocol_level=5,
                                              properties=props)))
    assert isinstance(ev, ConnectRequested)
    conn.auth_method = "SCRAM-SHA-256"
    conn.challenge(b"r=xy,s=c2FsdA==,i=4096")
    [a] = _reader().feed(conn.data_to_send())
    assert a == m.Disconnect(P.CONTINUE_AUTHENTICATION, {
        P.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
        P.AUTHENTICATION_DATA: b"r=xy,s=c2FsdA==,i=4096"}, m.AUTH)
    # the client's answer, and a PUBLISH right behind it held until the CONNACK
    publish = encode(m.Publish("t", b"x", 0, properties={}))
    assert conn.receive_data(_auth(P.CONTINUE_AUTHENTICATION, "SCRAM-SHA-256", b"final")
                             + publish) == [AuthContinued(b"final")]
    conn.accept(False, "u", {P.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
                             P.AUTHENTICATION_DATA: b"v=sig"})
    [ev] = conn.receive_data(b"")
    assert ev.topic == "t"


@pytest.mark.parametrize("packet", [
    encode(m.Publish("t", b"x", 0, properties={})),             # MQTT-3.1.2-30
    _auth(P.REAUTHENTICATE, "SCRAM-SHA-256"),                     # not an answer
    _auth(P.CONTINUE_AUTHENTICATION, "PLAIN"),                    # another method
])
def test_connection_challenge_violations(packet):
    conn = ServerConnection()
    conn.receive_data(encode(m.Connect("c", True, 30, protocol_level=5, properties={
        P.AUTHENTICATION_METHOD: "SCRAM-SHA-256"})))
    conn.auth_method = "SCRAM-SHA-256"
    conn.challenge(b"r=xy,s=c2FsdA==,i=4096")
    [ev] = conn.receive_data(packet)
    assert isinstance(ev, ProtocolViolation) and conn.closed


def test_reauth_challenge_round():
    conn = _connected("SCRAM-SHA-256")
    [ev] = conn.receive_data(_auth(P.REAUTHENTICATE, "SCRAM-SHA-256", b"first"))
    assert ev == ReauthRequested(b"first")
    conn.challenge(b"server-first")
    conn.data_to_send()
    [ev] = conn.receive_data(_auth(P.CONTINUE_AUTHENTICATION, "SCRAM-SHA-256", b"final"))
    assert ev == AuthContinued(b"final")
    conn.auth_success(b"v=sig")
    [a] = _reader().feed(conn.data_to_send())
    assert a == m.Disconnect(0, {P.AUTHENTICATION_METHOD: "SCRAM-SHA-256",
                                 P.AUTHENTICATION_DATA: b"v=sig"}, m.AUTH)
    # an AUTH 0x18 now answers nothing
    [ev] = conn.receive_data(_auth(P.CONTINUE_AUTHENTICATION, "SCRAM-SHA-256"))
    assert isinstance(ev, ProtocolViolation)


def test_packets_behind_an_undecided_connect_wait_for_it():
    """A CONNECT the broker has not decided yet (no challenge: its login waits for
    something else) holds what follows, whatever it is, until the CONNACK."""
    conn = ServerConnection()
    [ev] = conn.receive_data(encode(m.Connect("c", True, 30, protocol_level=5,
                                              properties={})))
    assert isinstance(ev, ConnectRequested)
    assert conn.receive_data(encode(m.Subscribe(1, [("t", 0)], {}))) == []
    assert conn.receive_data(encode(m.Publish("t", b"x", 0, properties={}))) == []
    conn.accept(False, "guest", {})
    events = conn.receive_data(b"")
    assert [type(e).__name__ for e in events] == ["SubscribeRequested", "Publish"]


def test_scram_session_counts_logins_and_refuses_with_0x86(broker):
    """In a whole broker (no sockets): a SCRAM login and a wrong proof count in the
    login attempts as PLAIN's do; the wrong one gets CONNACK 0x86 after the challenge."""
    from broker.listeners.mqtt_session import MQTTService, MQTTSession

    broker.access.add_user("sam", "s3cret")
    broker.access.set_permissions("sam", "/", ".*", ".*", ".*")
    service = MQTTService(broker)

    def login(password: str) -> list:
        session = MQTTSession(service, "127.0.0.1:40000", "127.0.0.1")
        reader = _reader()
        client = ScramClient("sam", password)
        session.data_received(encode(m.Connect("c-" + password, True, 30, protocol_level=5,
                                               properties={P.AUTHENTICATION_METHOD: METHOD,
                                                           P.AUTHENTICATION_DATA: client.first()})))
        [challenge] = reader.feed(session.conn.data_to_send())
        assert (challenge.type, challenge.reason_code) == (m.AUTH, P.CONTINUE_AUTHENTICATION)
        final = client.final(challenge.properties[P.AUTHENTICATION_DATA])
        session.data_received(_auth(P.CONTINUE_AUTHENTICATION, METHOD, final))
        [ack] = reader.feed(session.conn.data_to_send())
        if ack.return_code == 0:
            assert ack.properties[P.AUTHENTICATION_DATA] == client.expected_final
        session.connection_lost()
        return [ack.return_code, list(broker.access.auth_attempts["mqtt"])]

    assert login("s3cret") == [0, [1, 1, 0]]
    assert login("wrong") == [P.BAD_USER_NAME_OR_PASSWORD, [2, 1, 1]]


METHOD = "SCRAM-SHA-256"
