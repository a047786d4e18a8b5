"""A half message whose reply_to is ``amq.rabbitmq.reply-to``: the broker rewrote it to the
producer's reply name, and the check-backs go straight to that consumer (they went
nowhere before: no queue has a reply name)."""
from __future__ import annotations

import pytest

from broker.amqp import spec
from broker.direct_reply import REPLY_PREFIX, REPLY_QUEUE

from ..support import methods
from .test_core import decide, get, half


@pytest.fixture
def tx(broker, clock):
    broker.transactions.clock = clock
    return broker.transactions


@pytest.fixture
def client(session_client, tx):
    c = session_client()
    c.open_channel(1)
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    c.declare_queue(1, "orders", durable=True)
    return c


def test_check_backs_reach_a_direct_reply_consumer(client, tx, clock):
    [ok] = methods(client.consume(1, REPLY_QUEUE, tag="checks", no_ack=True))
    assert ok.consumer_tag == "checks"
    half(client, headers={"x-transaction-timeout": 1000, "x-transaction-check-max": 2},
         reply_to=REPLY_QUEUE)
    client.output()
    clock.advance(1.001)
    [d] = [w for w in client.output() if isinstance(w.method, spec.Basic.Deliver)]
    assert d.method.consumer_tag == "checks" and d.method.routing_key.startswith(REPLY_PREFIX)
    assert d.body == b"order" and d.properties["correlation_id"] == "tx-1"
    assert d.properties["headers"]["x-transaction-check"] == 1
    assert tx.stats["checks"] == 1
    # answered: the commit goes through as for any check-back
    decide(client, "commit", d.properties["correlation_id"])
    assert get(client).body == b"order"
