"""MQTT 5 enhanced authentication with a challenge round: SCRAM-SHA-256 (RFC 5802/7677)
over AUTH packets, from paho-mqtt against a TrioMQ subprocess. paho 2 sends a CONNECT's
Authentication Method and Data but neither reads nor sends AUTH packets, so the client here
is paho's, taught those two (``ScramPaho``: the network loop, CONNECT, CONNACK and the
properties stay paho's), and the client side of SCRAM is written here from the RFC with
hashlib/hmac. Users are made over the management HTTP API: with a password (SCRAM
credentials are made) and from a hash (none can be: 0x8C Bad authentication method).
Mosquitto offers no SCRAM method (its plugins may), so TrioMQ only."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
import uuid

import httpx
import paho.mqtt.client as paho
import pytest
from brokerproc import BrokerProc
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.mqtt import properties as P
from broker.security.passwords import hash_password

pytestmark = pytest.mark.timeout(90)
METHOD = "SCRAM-SHA-256"
AUTH = 0xF0


@pytest.fixture(scope="module")
def triomq(tmp_path_factory, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = BrokerProc(tmp_path_factory.mktemp("mqtt_scram") / "data", mqtt=True, http=True)
    proc.start()
    with httpx.Client(base_url=proc.http_url + "/api", auth=("guest", "guest"),
                      timeout=30) as api:
        for name, body in (("sam", {"password": "s3cret", "tags": ""}),
                           ("hashed", {"password_hash": hash_password("s3cret"), "tags": ""})):
            assert api.put(f"/users/{name}", json=body).status_code in (201, 204)
            assert api.put(f"/permissions/%2F/{name}",
                           json={"configure": ".*", "write": ".*", "read": ".*"}
                           ).status_code in (201, 204)
    yield proc
    proc.stop()


class Scram:
    """The client side of SCRAM-SHA-256, without channel binding."""

    def __init__(self, user: str, password: str):
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.bare = f"n={user},r={self.nonce}"
        self.server_final = b""

    def first(self) -> bytes:
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce) and attrs["r"] != self.nonce
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(),
                                     base64.b64decode(attrs["s"]), int(attrs["i"]))
        without_proof = "c=" + base64.b64encode(b"n,,").decode() + ",r=" + attrs["r"]
        auth = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        signature = hmac.new(hashlib.sha256(client_key).digest(), auth,
                             hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.server_final = b"v=" + base64.b64encode(
            hmac.new(server_key, auth, hashlib.sha256).digest())
        return (without_proof + ",p=" + base64.b64encode(proof).decode()).encode()


class ScramPaho(paho.Client):
    """paho's client, plus AUTH packets: each one received is answered by ``scram``
    (AUTH 0x18 with the client-final-message) and recorded in ``auths``."""

    def __init__(self, scram: Scram):
        super().__init__(CallbackAPIVersion.VERSION2, client_id="scram-" + uuid.uuid4().hex[:8],
                         protocol=paho.MQTTv5)
        self.scram = scram
        self.auths: list[tuple[int, Properties]] = []
        self.got: list = []
        self.connack: tuple[int, Properties] | None = None
        self.connected = threading.Event()
        self.disconnect_code: int | None = None
        self.gone = threading.Event()
        self.auth_done = threading.Event()
        self.on_connect = self._connected
        self.on_disconnect = self._disconnected
        self.on_message = lambda c, u, msg: self.got.append(msg.payload)

    def _connected(self, client, userdata, flags, rc, props):
        self.connack = (rc.value, props)
        if rc.value:
            self.disconnect()  # no reconnecting with the CONNECT's first message
        self.connected.set()

    def _disconnected(self, client, userdata, flags, rc, props):
        if self.disconnect_code is None:
            self.disconnect_code = rc.value
        self.disconnect()  # (paho would reconnect)
        self.gone.set()

    def _packet_handle(self):
        if self._in_packet["command"] & 0xF0 != AUTH:
            return super()._packet_handle()
        body = bytes(self._in_packet["packet"])
        code = body[0] if body else 0
        props = Properties(PacketTypes.AUTH)
        if len(body) > 1:
            props.unpack(body[1:])
        self.auths.append((code, props))
        if code == P.CONTINUE_AUTHENTICATION:
            self.send_auth(P.CONTINUE_AUTHENTICATION, self.scram.final(props.AuthenticationData))
        else:
            self.auth_done.set()
        return paho.MQTT_ERR_SUCCESS

    def send_auth(self, code: int, data: bytes):
        props = Properties(PacketTypes.AUTH)
        props.AuthenticationMethod = METHOD
        props.AuthenticationData = data
        packed = props.pack()
        packet = bytearray((AUTH,))
        self._pack_remaining_length(packet, 1 + len(packed))
        packet.append(code)
        packet += packed
        return self._packet_queue(AUTH, packet, 0, 0)

    def reauthenticate(self, scram: Scram) -> None:
        self.scram = scram
        self.auth_done.clear()
        self.send_auth(P.REAUTHENTICATE, scram.first())


_clients: list[ScramPaho] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _clients:
        c = _clients.pop()
        c.disconnect()
        c.loop_stop()


def _connect(port: int, user: str, password: str, method: str = METHOD,
             data: bytes | None = None) -> ScramPaho:
    scram = Scram(user, password)
    c = ScramPaho(scram)
    _clients.append(c)
    props = Properties(PacketTypes.CONNECT)
    props.AuthenticationMethod = method
    props.AuthenticationData = scram.first() if data is None else data
    c.connect("127.0.0.1", port, keepalive=30, properties=props)
    c.loop_start()
    assert c.connected.wait(30), "no CONNACK"
    return c


def test_scram_login_proves_both_sides_and_the_connection_works(triomq):
    c = _connect(triomq.mqtt_port, "sam", "s3cret")
    rc, props = c.connack
    assert rc == 0
    # one challenge round: AUTH 0x18 with the server-first-message, before the CONNACK
    [(code, first)] = c.auths
    assert code == P.CONTINUE_AUTHENTICATION and first.AuthenticationMethod == METHOD
    assert first.AuthenticationData.startswith(b"r=" + c.scram.nonce.encode())
    # the CONNACK names the method and carries the server-final-message: the server
    # proves it holds the credentials too
    assert props.AuthenticationMethod == METHOD
    assert props.AuthenticationData == c.scram.server_final
    subscribed = threading.Event()
    c.on_subscribe = lambda *a: subscribed.set()
    c.subscribe("scram/t", qos=1)
    assert subscribed.wait(30)
    c.publish("scram/t", b"hello", qos=1).wait_for_publish(30)
    deadline = threading.Event()
    for _ in range(300):
        if c.got:
            break
        deadline.wait(0.1)
    assert c.got == [b"hello"]


@pytest.mark.parametrize("user, password", [("sam", "wrong"), ("nobody", "s3cret")])
def test_wrong_password_or_unknown_user_refused_alike(triomq, user, password):
    c = _connect(triomq.mqtt_port, user, password)
    # the exchange runs to its end (an unknown user is not told apart), then 0x86
    assert [code for code, _ in c.auths] == [P.CONTINUE_AUTHENTICATION]
    assert c.connack[0] == P.BAD_USER_NAME_OR_PASSWORD


def test_user_made_from_a_hash_has_no_scram(triomq):
    c = _connect(triomq.mqtt_port, "hashed", "s3cret")
    assert c.connack[0] == P.BAD_AUTHENTICATION_METHOD and c.auths == []
    # PLAIN works with the hash
    c = _connect(triomq.mqtt_port, "hashed", "s3cret", "PLAIN", b"\x00hashed\x00s3cret")
    assert c.connack[0] == 0


def test_reauthentication_with_a_challenge_round(triomq):
    port = triomq.mqtt_port
    with httpx.Client(base_url=triomq.http_url + "/api", auth=("guest", "guest"),
                      timeout=30) as api:
        assert api.put("/users/rea", json={"password": "one", "tags": ""}).status_code == 201
        assert api.put("/permissions/%2F/rea", json={"configure": ".*", "write": ".*",
                                                      "read": ".*"}).status_code == 201
        c = _connect(port, "rea", "one")
        assert c.connack[0] == 0
        for _ in range(2):  # twice on the working connection
            again = Scram("rea", "one")
            c.reauthenticate(again)
            assert c.auth_done.wait(30), "no AUTH 0x00"
            code, props = c.auths[-1]
            assert code == P.SUCCESS and props.AuthenticationMethod == METHOD
            assert props.AuthenticationData == again.server_final
        c.publish("scram/r", b"x", qos=1).wait_for_publish(30)
        # ctl change_password's call: new SCRAM credentials; the old password no longer
        # re-authenticates (DISCONNECT 0x87), the new one logs in
        assert api.put("/users/rea", json={"password": "two", "tags": ""}).status_code == 204
        c.reauthenticate(Scram("rea", "one"))
        assert c.gone.wait(30), "still connected"
        assert c.disconnect_code == P.NOT_AUTHORIZED
        assert _connect(port, "rea", "two").connack[0] == 0
        assert _connect(port, "rea", "one").connack[0] == P.BAD_USER_NAME_OR_PASSWORD
