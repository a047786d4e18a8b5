"""Policies and operator policies with pika: the same scenarios against TrioMQ and RabbitMQ.

Policies are set through the management HTTP API: RabbitMQ's on 15672 (a temporary vhost
with a unique prefix, deleted after, which takes its policies with it); for TrioMQ, a
broker of this module's own (``brokerproc``) with its HTTP API on a free port.

Every assertion is what RabbitMQ 3.10 does, so both runs check the same behaviour.
"""
from __future__ import annotations

import html
import time
import uuid
from urllib.parse import quote, urlparse

import httpx
import pika
import pytest
from reference import require_rabbitmq_api

RABBIT_USER = ("guest", "guest")


class HttpPolicies:
    """A broker's management API (RabbitMQ's shape): policies and queue details."""

    def __init__(self, base: str, vhost: str, amqp: pika.ConnectionParameters):
        self.base = base.rstrip("/")
        self.vhost = vhost
        self.amqp = amqp
        self.http = httpx.Client(auth=RABBIT_USER, timeout=10)

    def _url(self, kind: str, name: str) -> str:
        return f"{self.base}/api/{kind}/{quote(self.vhost, safe='')}/{quote(name, safe='')}"

    def put(self, name: str, body: dict, operator: bool = False) -> tuple[int, str]:
        r = self.http.put(self._url("operator-policies" if operator else "policies", name),
                          json=body)
        reason = r.json().get("reason", "") if r.status_code >= 400 and r.content else ""
        return r.status_code, html.unescape(reason)  # RabbitMQ escapes < and > in policy texts

    def clear(self, name: str, operator: bool = False) -> int:
        return self.http.delete(self._url("operator-policies" if operator else "policies",
                                          name)).status_code

    def queue(self, name: str) -> dict:
        return self.http.get(self._url("queues", name)).json()

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def target(request, tmp_path_factory):
    url = request.config.getoption("--broker-url")
    if url:
        yield from _rabbitmq(url)
        return
    yield from _triomq(tmp_path_factory)


def _rabbitmq(url: str):
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    base = f"http://{host}:15672"
    vhost = f"itest-policies-{uuid.uuid4().hex[:8]}"
    require_rabbitmq_api(base, host=host).close()
    http = httpx.Client(auth=RABBIT_USER, timeout=10)
    r = http.put(f"{base}/api/vhosts/{quote(vhost, safe='')}")
    assert r.status_code in (201, 204), r.text
    try:
        http.put(f"{base}/api/permissions/{quote(vhost, safe='')}/guest",
                 json={"configure": ".*", "write": ".*", "read": ".*"})
        amqp = pika.ConnectionParameters(host, parsed.port or 5672, vhost,
                                         pika.PlainCredentials(*RABBIT_USER),
                                         connection_attempts=1, socket_timeout=10)
        t = HttpPolicies(base, vhost, amqp)
        yield t
        t.close()
    finally:
        http.delete(f"{base}/api/vhosts/{quote(vhost, safe='')}")
        http.close()


def _triomq(tmp_path_factory):
    from brokerproc import BrokerProc
    proc = BrokerProc(tmp_path_factory.mktemp("policies") / "data", store="memory", http=True)
    proc.start()
    t = HttpPolicies(proc.http_url, "/", pika.URLParameters(proc.url + "%2F?connection_attempts=1"))
    try:
        yield t
    finally:
        t.close()
        proc.stop()


@pytest.fixture
def ch(target):
    conn = pika.BlockingConnection(target.amqp)
    yield conn.channel()
    if conn.is_open:
        conn.close()


@pytest.fixture
def name():
    return f"itest-pol-{uuid.uuid4().hex[:8]}"


def policy(target, pname, pattern, definition, apply_to="queues", priority=0, operator=False):
    status, reason = target.put(pname, {"pattern": pattern, "definition": definition,
                                        "apply-to": apply_to, "priority": priority},
                                operator=operator)
    assert status in (201, 204), reason


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_count(ch, queue: str, expected: int, within: float = 5.0) -> int:
    """Policies reach RabbitMQ's queue processes asynchronously: poll briefly."""
    deadline = time.monotonic() + within
    while True:
        n = count(ch, queue)
        if n == expected or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def publish(ch, queue: str, n: int) -> None:
    """``n`` messages to ``queue``, then a round trip: the broker has enqueued them."""
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode())
    count(ch, queue)


def fanout_dlx(ch, exchange: str, queue: str) -> None:
    ch.exchange_declare(exchange, "fanout", auto_delete=False)
    ch.queue_declare(queue)
    ch.queue_bind(queue, exchange)


def test_lower_max_length_dead_letters_the_head_at_once(target, ch, name):
    fanout_dlx(ch, f"{name}.dlx", f"{name}.dead")
    ch.queue_declare(name)
    publish(ch, name, 10)
    policy(target, name, f"^{name}$", {"max-length": 3, "dead-letter-exchange": f"{name}.dlx"})
    assert wait_count(ch, name, 3) == 3
    assert wait_count(ch, f"{name}.dead", 7) == 7
    _m, props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"7"
    _m, props, body = ch.basic_get(f"{name}.dead", auto_ack=True)
    assert body == b"0" and props.headers["x-death"][0]["reason"] == "maxlen"
    assert target.clear(name) == 204
    time.sleep(0.2)
    publish(ch, name, 10)
    assert wait_count(ch, name, 12) == 12


def test_a_reject_publish_queue_keeps_what_it_has(target, ch, name):
    ch.queue_declare(name, arguments={"x-overflow": "reject-publish"})
    publish(ch, name, 10)
    policy(target, name, f"^{name}$", {"max-length": 3})
    time.sleep(0.3)
    assert count(ch, name) == 10
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"refused")


def test_message_ttl_applies_to_messages_enqueued_after_it(target, ch, name):
    ch.queue_declare(name)
    publish(ch, name, 3)
    policy(target, name, f"^{name}", {"message-ttl": 100})
    time.sleep(0.4)
    assert count(ch, name) == 3  # their expiry was fixed when they were enqueued: none
    ch.queue_declare(name + "-2")
    time.sleep(0.2)
    publish(ch, name + "-2", 3)
    assert wait_count(ch, name + "-2", 0) == 0


def test_numeric_limits_take_the_lower_of_argument_and_policy(target, ch, name):
    ch.queue_declare(name + "-a5", arguments={"x-max-length": 5})
    ch.queue_declare(name + "-a2", arguments={"x-max-length": 2})
    policy(target, name, f"^{name}", {"max-length": 3})
    time.sleep(0.3)
    for q in (name + "-a5", name + "-a2"):
        publish(ch, q, 10)
    assert wait_count(ch, name + "-a5", 3) == 3
    assert wait_count(ch, name + "-a2", 2) == 2


def test_the_dead_letter_exchange_argument_wins(target, ch, name):
    fanout_dlx(ch, f"{name}.dlxa", f"{name}.dla")
    fanout_dlx(ch, f"{name}.dlxp", f"{name}.dlp")
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": f"{name}.dlxa",
                                      "x-max-length": 1})
    policy(target, name, f"^{name}$", {"dead-letter-exchange": f"{name}.dlxp"})
    time.sleep(0.3)
    publish(ch, name, 3)
    assert wait_count(ch, f"{name}.dla", 2) == 2
    assert count(ch, f"{name}.dlp") == 0


def test_operator_policy_caps_arguments_and_policies(target, ch, name):
    policy(target, name + "-o", f"^{name}", {"max-length": 4}, operator=True)
    policy(target, name + "-p", f"^{name}", {"max-length": 6})
    time.sleep(0.2)
    ch.queue_declare(name + "-1")
    ch.queue_declare(name + "-2", arguments={"x-max-length": 8})
    ch.queue_declare(name + "-3", arguments={"x-max-length": 2})
    for q in ("-1", "-2", "-3"):
        publish(ch, name + q, 10)
    assert [wait_count(ch, name + q, want) for q, want in (("-1", 4), ("-2", 4), ("-3", 2))] \
        == [4, 4, 2]
    deadline = time.monotonic() + 10  # RabbitMQ's management stats catch up in a few seconds
    while True:
        info = target.queue(name + "-2")
        if info.get("policy") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (info["policy"], info["operator_policy"], info["effective_policy_definition"]) == \
        (name + "-p", name + "-o", {"max-length": 4})
    assert info["arguments"] == {"x-max-length": 8}


def test_the_highest_priority_policy_applies_alone(target, ch, name):
    policy(target, name + "-lo", f"^{name}$", {"max-length": 2, "message-ttl": 100}, priority=1)
    policy(target, name + "-hi", f"^{name}$", {"max-length": 5}, priority=2)
    time.sleep(0.2)
    ch.queue_declare(name)
    publish(ch, name, 10)
    time.sleep(0.3)  # the lower policy's TTL is not merged in: nothing expires
    assert wait_count(ch, name, 5) == 5


def test_expires_restarts_the_idle_timer(target, ch, name):
    ch.queue_declare(name)
    time.sleep(0.5)
    policy(target, name, f"^{name}$", {"expires": 800})
    time.sleep(0.3)
    assert count(ch, name) == 0  # still there: the timer started with the policy
    time.sleep(1.2)  # a passive declare is a use: it restarted the timer, 800 ms ago at most
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        count(ch, name)
    assert info.value.reply_code == 404


def test_alternate_exchange_policy_applies_to_the_next_publish(target, ch, name):
    fanout_dlx(ch, f"{name}.ae", f"{name}.aeq")
    ch.exchange_declare(name, "direct")
    ch.basic_publish(name, "nokey", b"lost")
    assert count(ch, f"{name}.aeq") == 0  # a round trip: the broker has routed "lost"
    policy(target, name, f"^{name}$", {"alternate-exchange": f"{name}.ae"}, apply_to="exchanges")
    deadline = time.monotonic() + 5
    while count(ch, f"{name}.aeq") == 0 and time.monotonic() < deadline:
        ch.basic_publish(name, "nokey", b"kept")
        time.sleep(0.1)
    _m, _p, body = ch.basic_get(f"{name}.aeq", auto_ack=True)
    assert body == b"kept"


@pytest.mark.parametrize("definition, operator, reason", [
    ({"max-length": -1}, False, "-1 is not a valid maximum length"),
    ({"ha-mode": "exactly", "ha-params": 0}, False, 'ha-mode="exactly" takes an integer, 0 given'),
    ({"ha-mode": "nodes", "ha-params": [1]}, False,
     'ha-mode="nodes" takes a list of strings, [1] was not a string'),
    ({"foo": 1}, False, '[{<<"foo">>,1}] are not recognised policy settings'),
    ({"overflow": "reject-publish"}, True,
     '[{<<"overflow">>,<<"reject-publish">>}] are not recognised policy settings'),
])
def test_invalid_policies_are_refused_with_the_same_reason(target, name, definition, operator,
                                                           reason):
    status, got = target.put(name, {"pattern": ".*", "definition": definition,
                                    "apply-to": "queues"}, operator=operator)
    # RabbitMQ's whole reason is "Validation failed\n\n<text>\n" (PolicyError.reason)
    assert status == 400 and reason in got, got
    assert target.clear(name, operator=operator) == 404
