"""Opaque OAuth 2 tokens (RFC 7662 introspection): the broker POSTs the token to an
introspection endpoint this module runs (http.server on a free 127.0.0.1 port, basic auth
with the broker's client id and secret), caches the answer until the token's exp, and maps
its ``scope`` as it maps a JWT's. The login waits for the answer at each edge (AMQP 0-9-1's
start-ok, MQTT's and STOMP's CONNECT, AMQP 1.0's sasl-init, the stream protocol's
SaslAuthenticate, the HTTP API's Authorization): pika, paho, stomp.py, qpid-proton, rstream
and httpx; inactive and expired tokens are refused with
RabbitMQ's 403 ACCESS_REFUSED (AMQP), CONNACK 4 (MQTT), an ERROR frame (STOMP), SASL auth
failure (AMQP 1.0), 401 (HTTP). The broker runs as ``python -m broker run`` with --oauth2-introspection-*."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest

from .test_oauth2 import REPO, _listening, _wait, free_port

ALL = "rabbitmq.tag:monitoring rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*"
CLIENT = ("triomq-broker", "introspection-secret")


class Introspection:
    """An RFC 7662 endpoint: ``tokens`` maps an opaque token to its answer."""

    def __init__(self):
        self.tokens: dict[str, dict] = {}
        self.asked: list[str] = []  # the tokens asked about, in order
        self.bad_client = 0  # requests without the broker's client credentials
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                expected = "Basic " + base64.b64encode(":".join(CLIENT).encode()).decode()
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0)))
                                .decode())
                if self.headers.get("Authorization") != expected:
                    outer.bad_client += 1
                    status, body = 401, {"error": "invalid_client"}
                else:
                    token = form.get("token", [""])[0]
                    outer.asked.append(token)
                    status, body = 200, outer.tokens.get(token, {"active": False})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/introspect"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def issue(self, token: str, scope: str = ALL, exp: float = 300, **claims) -> str:
        self.tokens[token] = {"active": True, "scope": scope, "username": "opaque-user",
                              "sub": "user-id-1", "exp": int(time.time() + exp),
                              "aud": "rabbitmq", **claims}
        return token

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Env:
    def __init__(self, tmp: Path):
        self.idp = Introspection()
        self.amqp, self.http, self.mqtt = free_port(), free_port(), free_port()
        self.stomp, self.stream = free_port(), free_port()
        self.log_path = tmp / "broker.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the broker's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
             "--port", str(self.amqp), "--data-dir", str(tmp / "data"),
             "--http-port", str(self.http), "--mqtt-port", str(self.mqtt),
             "--stomp-port", str(self.stomp), "--stream-port", str(self.stream),
             "--oauth2-resource-server-id", "rabbitmq",
             "--oauth2-introspection-url", self.idp.url,
             "--oauth2-introspection-client-id", CLIENT[0],
             "--oauth2-introspection-client-secret", CLIENT[1]],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        ports = (self.amqp, self.http, self.mqtt, self.stomp, self.stream)
        _wait(lambda: all(map(_listening, ports)), 60,
              "the broker to listen")

    def connect(self, token: str):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqp, "/", pika.PlainCredentials("anyone", token),
            connection_attempts=1, blocked_connection_timeout=60))

    def mqtt_connect(self, token: str) -> int:
        """The CONNACK code paho reports for a CONNECT with the token as password."""
        result: list[int] = []
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"introspect-{token}",
                        protocol=mqtt.MQTTv311)
        c.username_pw_set("anyone", token)
        c.on_connect = lambda cl, ud, flags, rc, props=None: result.append(rc.value)
        c.connect("127.0.0.1", self.mqtt)
        deadline = time.monotonic() + 30
        while not result and time.monotonic() < deadline:
            c.loop(timeout=0.5)
        c.disconnect()
        assert result, "no CONNACK"
        return result[0]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.idp.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = Env(tmp_path_factory.mktemp("introspection"))
    yield e
    e.stop()


def test_opaque_token_on_amqp_cached_until_exp(env):
    token = env.idp.issue("opaque-amqp-1")
    conn = env.connect(token)
    ch = conn.channel()
    ch.queue_declare("introspected-q")
    ch.basic_publish("", "introspected-q", b"hello")
    _wait(lambda: ch.basic_get("introspected-q", auto_ack=True)[2] == b"hello", 10,
          "the message")
    conn.close()
    assert env.idp.asked.count(token) == 1
    assert env.idp.bad_client == 0  # the broker authenticated as its client
    env.connect(token).close()  # the cached answer: not asked again
    assert env.idp.asked.count(token) == 1


@pytest.mark.parametrize("kind", ["inactive", "expired", "other audience"])
def test_refused_tokens_on_amqp(env, kind):
    token = f"opaque-refused-{kind.replace(' ', '-')}"
    if kind == "expired":
        env.idp.issue(token, exp=-10)
    elif kind == "other audience":
        env.idp.issue(token, aud="someone-else")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        env.connect(token)
    assert "ACCESS_REFUSED" in str(info.value)
    assert token in env.idp.asked


def test_scopes_map_to_permissions(env):
    token = env.idp.issue("opaque-read-only", scope="rabbitmq.read:*/*")
    conn = env.connect(token)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("not-configurable")
    assert info.value.reply_code == 403
    assert info.value.reply_text == ("ACCESS_REFUSED - access to queue 'not-configurable' in "
                                     "vhost '/' refused for user 'opaque-user'")
    conn.close()


def test_expiry_closes_the_connection(env):
    token = env.idp.issue("opaque-short", exp=3)
    conn = env.connect(token)
    deadline = time.monotonic() + 60
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.5)
    assert info.value.reply_code == 320
    assert "credential expired" in info.value.reply_text


def test_opaque_token_on_mqtt(env):
    assert env.mqtt_connect(env.idp.issue("opaque-mqtt-1")) == 0
    # CONNACK 4, bad user name or password (paho reports 3.1.1's 4 as reason code 134)
    assert env.mqtt_connect("opaque-mqtt-unknown") == 134
    assert "opaque-mqtt-1" in env.idp.asked and "opaque-mqtt-unknown" in env.idp.asked


def test_opaque_token_on_the_http_api(env):
    token = env.idp.issue("opaque-http-1")
    r = httpx.get(f"http://127.0.0.1:{env.http}/api/whoami",
                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200
    assert r.json() == {"name": "opaque-user", "tags": ["monitoring"]}
    r = httpx.get(f"http://127.0.0.1:{env.http}/api/whoami",
                  headers={"Authorization": "Bearer opaque-http-unknown"}, timeout=30)
    assert r.status_code == 401
    # a broker user's password is no token: decided without asking the endpoint
    asked = len(env.idp.asked)
    r = httpx.get(f"http://127.0.0.1:{env.http}/api/whoami", auth=("guest", "guest"),
                  timeout=30)
    assert r.status_code == 200 and len(env.idp.asked) == asked


def _stomp_login(port: int, token: str) -> bool:
    import stomp
    import stomp.exception
    conn = stomp.Connection([("127.0.0.1", port)])
    try:
        conn.connect("anyone", token, wait=True)
    except stomp.exception.ConnectFailedException:
        return False
    conn.disconnect()
    return True


def test_opaque_token_on_stomp(env):
    token = env.idp.issue("opaque-stomp-1")
    assert _stomp_login(env.stomp, token)
    assert not _stomp_login(env.stomp, "opaque-stomp-unknown")
    assert token in env.idp.asked and "opaque-stomp-unknown" in env.idp.asked


def test_opaque_token_on_amqp10(env):
    from proton import Message
    from proton.utils import BlockingConnection
    token = env.idp.issue("opaque-amqp10-1")
    c = BlockingConnection(f"amqp://127.0.0.1:{env.amqp}", user="anyone", password=token,
                           timeout=30, allowed_mechs="PLAIN")
    c.create_sender("/queue/introspected-10").send(Message(body=b"x", inferred=True))
    c.close()
    with pytest.raises(Exception) as info:
        BlockingConnection(f"amqp://127.0.0.1:{env.amqp}", user="anyone",
                           password="opaque-amqp10-unknown", timeout=30,
                           allowed_mechs="PLAIN").close()
    assert "amqp:unauthorized-access" in str(info.value) or "auth" in str(info.value).lower()
    assert token in env.idp.asked and "opaque-amqp10-unknown" in env.idp.asked


def test_opaque_token_on_the_stream_protocol(env):
    import asyncio

    from rstream import Producer

    async def login(token: str) -> None:
        async with Producer("127.0.0.1", port=env.stream, username="anyone",
                            password=token) as p:
            await p.create_stream("introspected-s")

    token = env.idp.issue("opaque-stream-1")
    asyncio.run(asyncio.wait_for(login(token), 60))
    with pytest.raises(Exception) as info:
        asyncio.run(asyncio.wait_for(login("opaque-stream-unknown"), 60))
    assert not isinstance(info.value, TimeoutError)  # refused, not left waiting
    assert token in env.idp.asked and "opaque-stream-unknown" in env.idp.asked
