"""OAuth 2 / JWT tokens as rabbitmq_auth_backend_oauth2 takes them: a token as the password
(any user name) on AMQP and MQTT, ``Authorization: Bearer`` on the HTTP API, scopes mapped to
permissions, keys from PEM files (RS256, HS256 secret) and a JWKS URL (ES256, fetched again for
a kid it did not have), expiry closing the connection and connection.update-secret renewing it.

Tokens are signed here with keys generated here; the JWKS endpoint is a tiny http.server on a
free 127.0.0.1 port; the broker runs as ``python -m broker run`` with the --oauth2-* options."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import jwt
import pika
import pika.exceptions
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

REPO = Path(__file__).resolve().parents[2]
AUD = "rabbitmq"
ALL = "rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.1)


class Jwks:
    """A JWKS endpoint whose key set the test changes while it runs."""

    def __init__(self):
        self.keys: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, kid: str, private_key) -> None:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private_key.public_key()))
        self.keys.append({**jwk, "kid": kid, "use": "sig", "alg": "ES256"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Env:
    def __init__(self, tmp: Path):
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (tmp / "rsa.pem").write_bytes(self.rsa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        self.secret = b"a-shared-secret-of-32-bytes-min!"
        (tmp / "hmac.key").write_bytes(self.secret)
        self.ec1 = ec.generate_private_key(ec.SECP256R1())
        self.ec2 = ec.generate_private_key(ec.SECP256R1())
        self.jwks = Jwks()
        self.jwks.add("jwks-1", self.ec1)
        self.amqp, self.http, self.mqtt = free_port(), free_port(), free_port()
        self.log_path = tmp / "broker.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the broker's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
             "--port", str(self.amqp), "--data-dir", str(tmp / "data"),
             "--http-port", str(self.http), "--mqtt-port", str(self.mqtt),
             "--oauth2-resource-server-id", AUD,
             "--oauth2-signing-key", f"rsa-1={tmp / 'rsa.pem'}",
             "--oauth2-signing-key", f"hmac-1={tmp / 'hmac.key'}",
             "--oauth2-default-key", "rsa-1",
             "--oauth2-jwks-url", self.jwks.url,
             "--oauth2-preferred-username-claims", "user_name"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        _wait(lambda: all(map(_listening, (self.amqp, self.http, self.mqtt))), 60,
              "the broker to listen")

    def token(self, scope: str = ALL, *, sub: str = "alice", exp: float = 300, aud=AUD,
              key: str = "rsa-1", **claims) -> str:
        payload = {"sub": sub, "scope": scope, "aud": aud, "exp": int(time.time() + exp),
                   **claims}
        if key == "hmac-1":
            return jwt.encode(payload, self.secret, "HS256", headers={"kid": key})
        if key.startswith("jwks-"):
            private = self.ec1 if key == "jwks-1" else self.ec2
            return jwt.encode(payload, private, "ES256", headers={"kid": key})
        return jwt.encode(payload, self.rsa, "RS256", headers={"kid": key})

    def connect(self, token: str, vhost: str = "/", user: str = "ignored"):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqp, vhost, pika.PlainCredentials(user, token),
            connection_attempts=1))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.jwks.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = Env(tmp_path_factory.mktemp("oauth2"))
    yield e
    e.stop()


def test_token_as_password_on_amqp(env):
    conn = env.connect(env.token())
    ch = conn.channel()
    ch.queue_declare("oauth-q")
    ch.basic_publish("", "oauth-q", b"hello")
    _wait(lambda: ch.basic_get("oauth-q", auto_ack=True)[2] == b"hello", 10, "the message")
    conn.close()
    r = httpx.get(f"http://127.0.0.1:{env.http}/api/connections", auth=("guest", "guest"))
    assert r.status_code == 200


@pytest.mark.parametrize("kind, claims", [
    ("expired", {"exp": -10}),
    ("audience", {"aud": "someone-else"}),
    ("unknown kid", {"key": "no-such-kid"}),
])
def test_bad_tokens_are_refused_and_logged(env, kind, claims):
    token = env.token(sub=f"mallory-{kind.replace(' ', '-')}", **claims)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        env.connect(token)
    assert "ACCESS_REFUSED" in str(info.value)
    sub = f"mallory-{kind.replace(' ', '-')}"
    _wait(lambda: f"OAuth 2 login refused: user 'ignored' (token sub '{sub}')" in env.log(), 10,
          "the refusal's log line naming the user and the token's sub")


def test_internal_users_after_tokens(env):
    """A password that looks like a JWT but is no valid token is an internal user's password
    (RabbitMQ's backend chain: oauth2, then internal)."""
    dotted = "aaaaaaaaaa.bbbbbbbbbbbb.cccccccc"
    base = f"http://127.0.0.1:{env.http}"
    r = httpx.put(base + "/api/users/dotted", json={"password": dotted, "tags": ""},
                  auth=("guest", "guest"))
    assert r.status_code in (201, 204)
    r = httpx.put(base + "/api/permissions/%2F/dotted",
                  json={"configure": ".*", "write": ".*", "read": ".*"}, auth=("guest", "guest"))
    assert r.status_code in (201, 204)
    conn = env.connect(dotted, user="dotted")
    conn.channel().queue_declare("dotted-q")
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        env.connect(dotted, user="someone-else")


def test_bad_signature_is_refused(env):
    header, payload, _sig = env.token().split(".")
    forged = jwt.encode({"sub": "eve", "scope": ALL, "aud": AUD,
                         "exp": int(time.time() + 60)},
                        rsa.generate_private_key(public_exponent=65537, key_size=2048),
                        "RS256", headers={"kid": "rsa-1"})
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        env.connect(forged)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        env.connect(f"{header}.{payload}.AAAA")


def test_scopes_are_the_permissions(env):
    scope = ("rabbitmq.configure:%2F/scoped-* rabbitmq.write:%2F/scoped-* "
             "rabbitmq.read:%2F/scoped-* rabbitmq.write:%2F/amq.default other.read:*/*")
    conn = env.connect(env.token(scope, sub="bob"))
    ch = conn.channel()
    ch.queue_declare("scoped-ok")
    ch.basic_publish("", "scoped-ok", b"m")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("unscoped")
    assert info.value.reply_code == 403
    assert info.value.reply_text == ("ACCESS_REFUSED - access to queue 'unscoped' in vhost '/' "
                                     "refused for user 'bob'")
    conn.close()
    # no scope for this vhost: connection.open refused as for a user without permissions
    r = httpx.put(f"http://127.0.0.1:{env.http}/api/vhosts/elsewhere", auth=("guest", "guest"))
    assert r.status_code in (201, 204)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        env.connect(env.token(scope, sub="bob"), vhost="elsewhere")
    assert "(530) \"NOT_ALLOWED - access to vhost 'elsewhere' refused for user 'bob'\"" in str(
        info.value)


def test_preferred_username_claim_and_hs256_key(env):
    conn = env.connect(env.token(sub="svc-123", user_name="carol", key="hmac-1"))
    ch = conn.channel()
    ch.queue_declare("carol-q")
    r = httpx.get(f"http://127.0.0.1:{env.http}/api/connections", auth=("guest", "guest"))
    assert "carol" in [c.get("user") for c in r.json()]
    conn.close()


def test_jwks_keys_and_a_kid_fetched_again(env):
    conn = env.connect(env.token(key="jwks-1"))
    conn.close()
    env.jwks.add("jwks-2", env.ec2)  # rotated in after the broker fetched the set

    def accepted() -> bool:
        try:
            env.connect(env.token(key="jwks-2")).close()
            return True
        except pika.exceptions.ProbableAuthenticationError:
            return False
    _wait(accepted, 30, "the new kid to be fetched")


def test_bearer_token_on_the_http_api(env):
    base = f"http://127.0.0.1:{env.http}"
    admin = env.token(ALL + " rabbitmq.tag:administrator", sub="dave")
    r = httpx.get(base + "/api/whoami", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200 and r.json()["name"] == "dave"
    assert "administrator" in str(r.json()["tags"])
    # the console's login form sends Basic credentials: a token pasted as the password
    # (any user name) logs in, as in RabbitMQ's management UI with basic auth left on
    r = httpx.get(base + "/api/whoami", auth=("whoever", admin))
    assert r.status_code == 200 and r.json()["name"] == "dave"
    # no management tag: RabbitMQ's 401
    plain = env.token(ALL, sub="erin")
    r = httpx.get(base + "/api/overview", headers={"Authorization": f"Bearer {plain}"})
    assert r.status_code == 401
    r = httpx.get(base + "/api/overview", headers={"Authorization": "Bearer not.a.token"})
    assert r.status_code == 401


def test_token_as_password_on_mqtt(env):
    from paho.mqtt import client as mqtt

    def connect(password: str) -> int:
        result: list = []
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"oauth-{time.time_ns()}")
        c.username_pw_set("anyone", password)
        c.on_connect = lambda cl, ud, flags, rc, props=None: result.append(rc)
        c.connect("127.0.0.1", env.mqtt)
        c.loop_start()
        try:
            _wait(lambda: result, 15, "CONNACK")
        finally:
            c.loop_stop()
            c.disconnect()
        return result[0].value if hasattr(result[0], "value") else int(result[0])

    assert connect(env.token(sub="mqtt-user")) == 0
    assert connect(env.token(sub="mqtt-user", exp=-10)) != 0


def test_mqtt_connection_closed_when_its_token_expires(env):
    from paho.mqtt import client as mqtt
    events: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"oauth-exp-{time.time_ns()}")
    c.username_pw_set("anyone", env.token(sub="mqtt-expiring", exp=5))
    c.on_connect = lambda cl, ud, flags, rc, props=None: events.append(("connect", rc))
    c.on_disconnect = lambda cl, ud, flags, rc, props=None: events.append(("disconnect", rc))
    c.reconnect_delay_set(60, 60)  # no reconnection within the test
    c.connect("127.0.0.1", env.mqtt)
    c.loop_start()
    try:
        _wait(lambda: any(e[0] == "connect" for e in events), 15, "CONNACK")
        _wait(lambda: any(e[0] == "disconnect" for e in events), 30,
              "the broker to close the connection")
    finally:
        c.loop_stop()
    assert "closing connection of user 'mqtt-expiring': credential expired" in env.log()


def test_expiry_closes_and_update_secret_renews(env):
    # renewed before its first token expires: open past that time (the first token lives
    # long enough for a connect on a loaded machine)
    first_exp = time.time() + 8
    conn = env.connect(env.token(exp=8))
    conn.update_secret(env.token(exp=300), "refresh")
    while time.time() < first_exp + 1.5:  # past the first exp and a sweep of expiries
        conn.process_data_events(time_limit=0.2)
    assert conn.is_open
    conn.channel().queue_declare("still-open")
    # a token for another user is refused: 530 and the connection closed
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret(env.token(sub="someone-else"), "swap")
    assert info.value.reply_code == 530
    assert "New secret was refused" in info.value.reply_text
    # not renewed: closed by the broker once the token expires
    conn = env.connect(env.token(exp=5))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    assert info.value.reply_code == 320
    assert "credential expired" in info.value.reply_text


def test_topic_scopes_limit_routing_keys(env):
    """``write:<vhost>/<exchange>/<routing key>`` limits publishes to a topic exchange and
    ``read:`` the binding keys from it; a two-part scope allows every key (before this, the
    third part was ignored and every key was allowed)."""
    scope = ("rabbitmq.configure:%2F/topic-q rabbitmq.write:%2F/topic-q "
             "rabbitmq.write:%2F/amq.topic/sensors.* rabbitmq.read:%2F/amq.topic/sensors.*")
    conn = env.connect(env.token(scope, sub="tina"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("topic-q")
    ch.queue_bind("topic-q", "amq.topic", "sensors.temp")
    ch.basic_publish("amq.topic", "sensors.temp", b"ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_bind("topic-q", "amq.topic", "alarms.fire")
    assert info.value.reply_code == 403
    assert info.value.reply_text == ("ACCESS_REFUSED - access to topic 'alarms.fire' in "
                                     "exchange 'amq.topic' in vhost '/' refused for user 'tina'")
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("amq.topic", "alarms.fire", b"refused")
    assert info.value.reply_code == 403
    assert "access to topic 'alarms.fire' in exchange 'amq.topic'" in info.value.reply_text
    ch = conn.channel()
    method = ch.queue_declare("topic-q", passive=True).method
    assert method.message_count == 1  # only the allowed publish arrived
    conn.close()
    # a two-part write scope: every routing key
    conn = env.connect(env.token("rabbitmq.write:%2F/amq.topic", sub="tina"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "alarms.fire", b"any key")
    conn.close()


def test_topic_scopes_on_mqtt_publishes(env):
    """An MQTT publish is a write to amq.topic with the topic as routing key (``/`` -> ``.``):
    a key outside the token's topic scope closes the connection, as RabbitMQ does."""
    from paho.mqtt import client as mqtt
    admin = env.connect(env.token(sub="watcher"))
    ch = admin.channel()
    ch.queue_declare("mqtt-topic-q")
    ch.queue_bind("mqtt-topic-q", "amq.topic", "#")
    events: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"oauth-topic-{time.time_ns()}")
    c.username_pw_set("anyone", env.token("rabbitmq.write:%2F/amq.topic/sensors.*",
                                          sub="mqtt-topic"))
    c.on_connect = lambda cl, ud, flags, rc, props=None: events.append(("connect", rc))
    c.on_publish = lambda cl, ud, mid, rc=None, props=None: events.append(("puback", mid))
    c.on_disconnect = lambda cl, ud, *a: events.append(("disconnect",))
    c.connect("127.0.0.1", env.mqtt)
    c.loop_start()
    try:
        _wait(lambda: any(e[0] == "connect" for e in events), 15, "CONNACK")
        ok = c.publish("sensors/temp", b"allowed", qos=1)
        _wait(lambda: ("puback", ok.mid) in events, 15, "PUBACK")
        c.publish("alarms/fire", b"refused", qos=1)
        _wait(lambda: ("disconnect",) in events, 15, "the broker to close the connection")
    finally:
        c.loop_stop()
    assert ch.queue_declare("mqtt-topic-q", passive=True).method.message_count == 1
    admin.close()
