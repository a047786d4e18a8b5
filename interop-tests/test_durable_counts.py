"""Delivery counts, retry levels and paged priority backlogs across kill -9 (journal store).

TrioMQ only (its own subprocess on a data dir it kills and restarts, see
test_durability.BrokerProc): skipped with --broker-url.
"""
from __future__ import annotations

import pika
import pytest
from brokerproc import BrokerProc
from test_durability import _drain, _publish

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("TrioMQ's own process and journal (kill -9, restart)")


@pytest.fixture
def journal_broker(tmp_path):
    b = BrokerProc(tmp_path / "data", "journal")
    b.start()
    yield b
    b.stop()


def _declare_with_dlq(b: BrokerProc, queue: str, **args) -> None:
    c = b.connect()
    ch = c.channel()
    ch.exchange_declare("dlx", "fanout", durable=True)
    ch.queue_declare("dlq", durable=True)
    ch.queue_bind("dlq", "dlx")
    ch.queue_declare(queue, durable=True, arguments={"x-dead-letter-exchange": "dlx", **args})
    ch.queue_declare("sync", durable=True)
    c.close()


def _get_and_reject(b: BrokerProc, queue: str, requeue: bool):
    """basic.get the head message and reject it: (redelivered, its x-delivery-count)."""
    c = b.connect()
    ch = c.channel()
    m, props, _body = ch.basic_get(queue)
    assert m is not None
    ch.basic_reject(m.delivery_tag, requeue=requeue)
    c.close()
    return m.redelivered, (props.headers or {}).get("x-delivery-count")


@pytest.mark.parametrize("args,requeue,reason", [
    ({"x-delivery-limit": 2}, True, "delivery_limit"),
    ({"x-retry-delays": [0, 0]}, False, "rejected"),
], ids=["delivery-limit", "retry-level"])
def test_two_failures_survive_kill9(journal_broker, args, requeue, reason):
    """A message rejected twice keeps its x-delivery-count across kill -9: the third
    failure passes the delivery limit of 2 / the last of two retry levels."""
    b = journal_broker
    _declare_with_dlq(b, "q", **args)
    _publish(b, "q", [b"m"])
    assert [_get_and_reject(b, "q", requeue) for _ in range(2)] == [(False, None), (True, 1)]
    _publish(b, "sync", [b"s"])  # a confirmed publish: the journal fsynced everything before it
    b.restart(hard=True)
    assert _get_and_reject(b, "q", requeue) == (True, 2)
    assert _drain(b, "q") == []
    [(body, _redelivered, props)] = _drain(b, "dlq")
    got = props.headers["x-death"][0]["reason"]
    assert (body, got.decode() if isinstance(got, bytes) else got) == (b"m", reason)


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "kill-9"])
def test_paged_priority_backlog_restarts_in_order(tmp_path, hard):
    b = BrokerProc(tmp_path / "data", "journal", extra=("--queue-memory-budget", "8192"))
    b.start()
    try:
        c = b.connect()
        ch = c.channel()
        ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 5})
        ch.queue_declare("sync", durable=True)
        c.close()
        sent = []
        for rnd in range(2):  # levels interleaved in the journal: 2, 0, 5, 1, 4, 3, 2, 0, ...
            for p in (2, 0, 5, 1, 4, 3):
                bodies = [b"%d:%d:%03d" % (p, rnd, i) for i in range(50)]
                _publish(b, "prio", bodies, props=pika.BasicProperties(delivery_mode=2, priority=p))
                sent += [(-p, rnd, body) for body in bodies]
        first = _drain(b, "prio", limit=5)  # from the in-memory heads and the paged part
        _publish(b, "sync", [b"s"])  # confirmed: the acks before it are on disk too
        b.restart(hard=hard)
        rest = _drain(b, "prio")
        _publish(b, "sync", [b"s"])
        want = [body for _p, _r, body in sorted(sent)]
        assert [m[0] for m in first] + [m[0] for m in rest] == want
        b.restart(hard=hard)
        assert _drain(b, "prio") == []
    finally:
        b.stop()
