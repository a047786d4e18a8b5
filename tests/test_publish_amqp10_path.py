"""AMQP 1.0 publishes through the one publish path as the other protocols do
(tests/test_publishing.py's every-protocol tests): the publish hooks see the message, it is
routed to the same queue, and an ``x-delay`` application property is scheduled, not routed
at once. The broker runs in-process (AMQP 1.0 on its AMQP port); qpid-proton's blocking
client runs in a worker thread."""
from __future__ import annotations

import pytest
import trio
from proton import Message
from proton.utils import BlockingConnection

from broker.amqp import spec

from .test_publishing import _record_hook, _wait, every_protocol  # noqa: F401  (a fixture)


@pytest.fixture
def in_process(every_protocol):  # noqa: F811
    """test_publishing's broker, with its AMQP, MQTT, STOMP and HTTP listeners."""
    return every_protocol


def _send(port: int, address: str, body: bytes, properties: dict | None = None) -> None:
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=10,
                           allowed_mechs="PLAIN")
    try:
        snd = c.create_sender(address)
        snd.send(Message(body=body, inferred=True, properties=properties))  # settled: routed
    finally:
        c.close()


async def test_an_amqp10_publish_passes_the_hooks_and_routes_as_the_others(in_process):
    broker = in_process
    vhost = broker.vhosts["/"]
    seen = _record_hook(broker)
    q = vhost.declare_queue(spec.Queue.Declare(queue="same", arguments={}), None)
    vhost.bind("amq.topic", q, "t.same", {})
    await trio.to_thread.run_sync(_send, broker.amqp_port, "/exchange/amq.topic/t.same",
                                  b"same-amqp10")
    await _wait(lambda: q.message_count >= 1, "the message in the queue")
    assert [(x, k, body, v) for x, k, body, v in seen] == [
        ("amq.topic", "t.same", b"same-amqp10", "/")]


async def test_an_amqp10_x_delay_is_scheduled_not_routed(in_process):
    broker = in_process
    vhost = broker.vhosts["/"]
    vhost.declare_exchange(spec.Exchange.Declare(exchange="later", type="x-delayed-message",
                                                 arguments={"x-delayed-type": "direct"}))
    q = vhost.declare_queue(spec.Queue.Declare(queue="later", arguments={}), None)
    vhost.bind("later", q, "k", {})
    before = broker.scheduler.pending
    await trio.to_thread.run_sync(_send, broker.amqp_port, "/exchange/later/k", b"amqp10",
                                  {"x-delay": 60_000})
    await _wait(lambda: broker.scheduler.pending >= before + 1, "one scheduled")
    assert q.message_count == 0
