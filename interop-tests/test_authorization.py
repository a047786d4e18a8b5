"""The AMQP authorization matrix: every channel operation by users holding only configure,
only write, only read, everything (with topic permissions), an impersonator and limited
users -> allowed, or RabbitMQ's exact reply code and text. The same users, vhosts and
limits are given to both brokers as one definitions document: RabbitMQ gets it through
its management API (POST /api/definitions on 15672; every user and vhost removed after),
TrioMQ through --load-definitions (a broker of its own). Expectations are RabbitMQ's
rules (rabbit_channel's check_* functions), asserted on both brokers."""
from __future__ import annotations

import secrets
import time
from urllib.parse import quote

import pika
import pytest
from brokerproc import BrokerProc
from pika.exceptions import AMQPConnectionError, ChannelClosedByBroker, ConnectionClosedByBroker
from reference import require_rabbitmq_api

from broker.security.passwords import hash_password

P = "triomq_test_authz_" + secrets.token_hex(3)
V, LV = f"{P}_v", f"{P}_lv"  # the matrix vhost, the limited vhost
USERS = {"cfg": (".*", "", ""), "wr": ("", ".*", ""), "rd": ("", "", ".*"),
         "all": (".*", ".*", ".*"), "imp": (".*", ".*", ".*"), "lim": (".*", ".*", ".*")}
PASSWORD = "pw-" + secrets.token_hex(4)


def user(short: str) -> str:
    return f"{P}_{short}"


def definitions() -> dict:
    return {
        "users": [{"name": user(u), "password_hash": hash_password(PASSWORD),
                   "hashing_algorithm": "rabbit_password_hashing_sha256",
                   "tags": ["impersonator"] if u == "imp" else [],
                   **({"limits": {"max-connections": 1, "max-channels": 2}} if u == "lim" else {})}
                  for u in USERS],
        "vhosts": [{"name": V}, {"name": LV}],
        "permissions": [{"user": user(u), "vhost": V, "configure": c, "write": w, "read": r}
                        for u, (c, w, r) in USERS.items()]
        + [{"user": user("all"), "vhost": LV, "configure": ".*", "write": ".*", "read": ".*"}],
        "topic_permissions": [{"user": user("all"), "vhost": V, "exchange": "amq.topic",
                               "write": "^{username}\\.", "read": "^r\\."}],
        "parameters": [{"vhost": LV, "component": "vhost-limits", "name": "limits",
                        "value": {"max-queues": 1, "max-connections": 1}}],
    }


class Target:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port

    def connect(self, who: str, vhost: str = V, password: str = PASSWORD):
        return pika.BlockingConnection(pika.ConnectionParameters(
            self.host, self.port, vhost, pika.PlainCredentials(user(who), password),
            connection_attempts=1, socket_timeout=10, heartbeat=0))


@pytest.fixture(scope="module")
def target(external_broker, amqp_params, tmp_path_factory):
    if external_broker:
        require_rabbitmq_api(f"http://{amqp_params.host}:15672", host=amqp_params.host).close()
        import httpx
        api = httpx.Client(base_url=f"http://{amqp_params.host}:15672/api",
                           auth=(amqp_params.username, amqp_params.password), timeout=30)
        r = api.post("/definitions", json=definitions())
        assert r.status_code in (201, 204), r.text
        try:
            yield Target(amqp_params.host, amqp_params.port)
        finally:
            for u in USERS:
                api.delete(f"/users/{quote(user(u), safe='')}")
            for v in (V, LV):
                api.delete(f"/vhosts/{quote(v, safe='')}")
        return
    import json
    d = tmp_path_factory.mktemp("authz")
    (d / "defs.json").write_text(json.dumps(definitions()))
    bp = BrokerProc(d / "data", store="memory", extra=["--load-definitions", str(d / "defs.json")])
    bp.start()
    try:
        yield Target("127.0.0.1", bp.port)
    finally:
        bp.stop()


@pytest.fixture(scope="module")
def setup_entities(target):
    """q, x and x2 exist in the matrix vhost (made by the user with every permission)."""
    c = target.connect("all")
    ch = c.channel()
    ch.queue_declare("q")
    ch.exchange_declare("x", "direct")
    ch.exchange_declare("x2", "direct")
    c.close()


def refused(kind: str, name: str, who: str) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{V}' refused for user '{user(who)}'"


# operation -> (function of a channel, the checks RabbitMQ makes in order: (perm, kind, name))
OPS = {
    "queue.declare": (lambda ch: ch.queue_declare("cq"), [("configure", "queue", "cq")]),
    "queue.declare passive": (lambda ch: ch.queue_declare("q", passive=True), []),
    "queue.delete": (lambda ch: ch.queue_delete("dq"), [("configure", "queue", "dq")]),
    "queue.purge": (lambda ch: ch.queue_purge("q"), [("read", "queue", "q")]),
    "queue.bind": (lambda ch: ch.queue_bind("q", "x", "k"),
                   [("write", "queue", "q"), ("read", "exchange", "x")]),
    "queue.unbind": (lambda ch: ch.queue_unbind("q", "x", "k"),
                     [("write", "queue", "q"), ("read", "exchange", "x")]),
    "exchange.declare": (lambda ch: ch.exchange_declare("cx", "fanout"),
                         [("configure", "exchange", "cx")]),
    "exchange.declare with alternate-exchange": (
        lambda ch: ch.exchange_declare("cx-ae", "fanout", arguments={"alternate-exchange": "x"}),
        [("configure", "exchange", "cx-ae"), ("read", "exchange", "cx-ae"),
         ("write", "exchange", "x")]),
    "queue.declare with dead-letter exchange": (
        lambda ch: ch.queue_declare("cq-dlx", arguments={"x-dead-letter-exchange": "x"}),
        [("configure", "queue", "cq-dlx"), ("read", "queue", "cq-dlx"),
         ("write", "exchange", "x")]),
    "exchange.declare passive": (lambda ch: ch.exchange_declare("x", passive=True), []),
    "exchange.delete": (lambda ch: ch.exchange_delete("dx"), [("configure", "exchange", "dx")]),
    "exchange.bind": (lambda ch: ch.exchange_bind("x2", "x", "k"),
                      [("write", "exchange", "x2"), ("read", "exchange", "x")]),
    "exchange.unbind": (lambda ch: ch.exchange_unbind("x2", "x", "k"),
                        [("write", "exchange", "x2"), ("read", "exchange", "x")]),
    "basic.publish": (lambda ch: (ch.confirm_delivery(), ch.basic_publish("x", "k", b"m")),
                      [("write", "exchange", "x")]),
    "basic.publish default": (lambda ch: (ch.confirm_delivery(), ch.basic_publish("", "q", b"m")),
                              [("write", "exchange", "amq.default")]),
    "basic.get": (lambda ch: ch.basic_get("q", auto_ack=True), [("read", "queue", "q")]),
    "basic.consume": (lambda ch: ch.basic_consume("q", lambda *a: None), [("read", "queue", "q")]),
}
PERM_INDEX = {"configure": 0, "write": 1, "read": 2}


def outcome(conn, fn) -> tuple[int, str] | None:
    ch = conn.channel()
    try:
        fn(ch)
    except ChannelClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    ch.close()
    return None


def test_operation_matrix(target, setup_entities):
    failures = []
    for who in ("cfg", "wr", "rd", "all"):
        conn = target.connect(who)
        try:
            for op, (fn, checks) in OPS.items():
                expected = None
                for perm, kind, name in checks:
                    if not USERS[who][PERM_INDEX[perm]]:
                        expected = refused(kind, name, who)
                        break
                got = outcome(conn, fn)
                if got != expected:
                    failures.append(f"{who} {op}: expected {expected}, got {got}")
        finally:
            conn.close()
    assert not failures, "\n".join(failures)


def test_server_named_queues_need_configure_on_their_name(target, setup_entities):
    conn = target.connect("wr")
    try:
        code, text = outcome(conn, lambda ch: ch.queue_declare("", exclusive=True))
        assert code == 403 and text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
        assert text.endswith(f"' in vhost '{V}' refused for user '{user('wr')}'")
    finally:
        conn.close()


def _publish(exchange: str, routing_key: str):
    return lambda ch: (ch.confirm_delivery(), ch.basic_publish(exchange, routing_key, b"m"))


def test_topic_permissions(target, setup_entities):
    me = user("all")

    def topic(rk):
        return (403, f"ACCESS_REFUSED - access to topic '{rk}' in exchange 'amq.topic' in "
                     f"vhost '{V}' refused for user '{me}'")
    conn = target.connect("all")
    try:
        assert outcome(conn, _publish("amq.topic", f"{me}.news")) is None  # {username} expanded
        assert outcome(conn, _publish("amq.topic", "other.news")) == topic("other.news")
        assert outcome(conn, lambda ch: ch.queue_bind("q", "amq.topic", "r.x")) is None
        assert outcome(conn, lambda ch: ch.queue_bind("q", "amq.topic", "w.x")) == topic("w.x")
        assert outcome(conn, lambda ch: ch.queue_unbind("q", "amq.topic", "w.x")) == topic("w.x")
        assert outcome(conn, lambda ch: ch.queue_unbind("q", "amq.topic", "r.x")) is None
        assert outcome(conn, _publish("x", "any")) is None  # no topic checks on a direct exchange
    finally:
        conn.close()


def test_user_id_and_impersonator(target, setup_entities):
    for who, expected in (("all", (406, f"PRECONDITION_FAILED - user_id property set to "
                                        f"'someone' but authenticated user was '{user('all')}'")),
                          ("imp", None)):
        conn = target.connect(who)
        try:
            props = pika.BasicProperties(user_id="someone")
            assert outcome(conn, lambda ch, p=props: (
                ch.confirm_delivery(), ch.basic_publish("x", "k", b"m", p))) == expected
            own = pika.BasicProperties(user_id=user(who))
            assert outcome(conn, lambda ch, p=own: (
                ch.confirm_delivery(), ch.basic_publish("x", "k", b"m", p))) is None
        finally:
            conn.close()


def _refusal(exc: BaseException) -> str:
    """The broker's close text inside pika's connection-stage errors."""
    return " ".join(str(a) for a in exc.args)


def test_vhost_access_and_login_refusals(target):
    with pytest.raises(AMQPConnectionError) as e:
        target.connect("wr", vhost=LV)
    assert f"NOT_ALLOWED - access to vhost '{LV}' refused for user '{user('wr')}'" in _refusal(e.value)
    with pytest.raises(AMQPConnectionError) as e:
        target.connect("wr", password="wrong")
    assert ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
            "For details see the broker logfile.") in _refusal(e.value)
    with pytest.raises(AMQPConnectionError) as e:
        target.connect("nobody-at-all")
    assert "Login was refused using authentication mechanism PLAIN" in _refusal(e.value)


def test_user_limits(target):
    first = target.connect("lim")
    try:
        with pytest.raises(AMQPConnectionError) as e:
            target.connect("lim")
        assert (f"NOT_ALLOWED - connection refused for user '{user('lim')}': user connection "
                f"limit (1) is reached") in _refusal(e.value)
        first.channel()
        first.channel()
        with pytest.raises(ConnectionClosedByBroker) as e:
            first.channel()
        assert e.value.reply_code == 530
        assert e.value.reply_text == (f"NOT_ALLOWED - number of channels opened for user "
                                      f"'{user('lim')}' has reached the maximum allowed user "
                                      f"limit of (2)")
    finally:
        if first.is_open:
            first.close()


def test_vhost_limits(target):
    conn = target.connect("all", vhost=LV)
    try:
        with pytest.raises(AMQPConnectionError) as e:
            target.connect("all", vhost=LV)
        assert (f"NOT_ALLOWED - access to vhost '{LV}' refused for user '{user('all')}': "
                f"connection limit (1) is reached") in _refusal(e.value)
        assert outcome(conn, lambda ch: ch.queue_declare("one")) is None
        assert outcome(conn, lambda ch: ch.queue_declare("one")) is None  # exists: no limit
        assert outcome(conn, lambda ch: ch.queue_declare("two")) == (
            406, f"PRECONDITION_FAILED - cannot declare queue 'two': queue limit in vhost "
                 f"'{LV}' (1) is reached")
    finally:
        conn.close()


def test_failed_logins_wait_without_stalling_others(target, external_broker):
    if external_broker:
        pytest.skip("TrioMQ's failure delay")
    import threading
    took: dict = {}

    def bad():
        t = time.monotonic()
        with pytest.raises(AMQPConnectionError):
            target.connect("all", password="wrong")
        took["bad"] = time.monotonic() - t

    thread = threading.Thread(target=bad)
    thread.start()
    time.sleep(0.1)
    t = time.monotonic()
    conn = target.connect("all")
    outcome(conn, lambda ch: (ch.confirm_delivery(), ch.basic_publish("x", "k", b"m")))
    conn.close()
    quick = time.monotonic() - t
    thread.join()
    assert took["bad"] >= 0.8  # answered late
    assert quick < 0.8  # while another login went through at once
