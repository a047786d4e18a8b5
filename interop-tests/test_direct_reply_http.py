"""Direct reply-to answered through the management HTTP API: a reply published with
``POST /api/exchanges/{vhost}/amq.default/publish`` and the rewritten reply name as
routing key reaches the requester, as RabbitMQ's HTTP publish (an internal AMQP channel)
delivers it. Both brokers answer ``{"routed": false}`` (no queue has the name). Checked
on a TrioMQ started here and on the machine's RabbitMQ (127.0.0.1:5672/15672). TrioMQ
answered ``routed: false`` and dropped the reply before."""
from __future__ import annotations

import time
from urllib.parse import quote

import httpx
import pika
import pytest
from brokerproc import BrokerProc
from helpers import get_one
from reference import require_rabbitmq_api

REPLY_TO = "amq.rabbitmq.reply-to"


def _wait(pred, timeout: float, what: str, poll=None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout}s"
        if poll is not None:
            poll()
        else:
            time.sleep(0.05)


@pytest.fixture(scope="module", params=["triomq", "rabbitmq"])
def brokers(request, tmp_path_factory):
    """(AMQP port, management client) of either broker."""
    if request.param == "rabbitmq":
        client = require_rabbitmq_api()
        yield 5672, client
        client.close()
        return
    proc = BrokerProc(tmp_path_factory.mktemp("drhttp") / "data", store="memory", http=True)
    proc.start()
    client = httpx.Client(base_url=proc.http_url, auth=("guest", "guest"), timeout=30)

    def up() -> bool:
        try:
            return client.get("/api/overview").status_code == 200
        except httpx.HTTPError:
            return False

    _wait(up, 60, "the management listener")
    yield proc.port, client
    client.close()
    proc.stop()


def test_http_publish_reaches_the_requester(brokers):
    port, http = brokers
    params = pika.ConnectionParameters("127.0.0.1", port,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.BlockingConnection(params)
    server_conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        replies: list = []
        ch.basic_consume(REPLY_TO, lambda c, m, p, b: replies.append((m, p, b)), auto_ack=True)
        server = server_conn.channel()
        q = server.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"ping", pika.BasicProperties(reply_to=REPLY_TO,
                                                              correlation_id="c-1"))
        _, props, _ = get_one(server, q)
        name = props.reply_to
        assert name.startswith(REPLY_TO + ".")
        r = http.post("/api/exchanges/%2F/amq.default/publish",
                      json={"routing_key": name, "payload": "pong", "payload_encoding": "string",
                            "properties": {"correlation_id": "c-1"}})
        assert r.status_code == 200, r.text
        assert r.json() == {"routed": False}
        _wait(lambda: bool(replies), 10, "the reply", poll=lambda: conn.process_data_events(0.05))
        method, rprops, body = replies[0]
        assert (body, rprops.correlation_id, method.routing_key) == (b"pong", "c-1", name)
        # a reply for a requester that is gone is dropped, as before
        conn.close()
        r = http.post("/api/exchanges/%2F/amq.default/publish",
                      json={"routing_key": name, "payload": "late", "payload_encoding": "string",
                            "properties": {}})
        assert r.json() == {"routed": False}
        # no stray queue appeared under the reply name
        assert http.get("/api/queues/%2F/" + quote(name, safe="")).status_code == 404
    finally:
        for c in (conn, server_conn):
            if c.is_open:
                c.close()
