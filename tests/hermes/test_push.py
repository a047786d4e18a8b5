"""Push subscriptions against a real local endpoint that fails on purpose: 4xx (retried or
not), 5xx, 503 with Retry-After, timeouts, TTL then the dead-letter queue, the in-flight
window, ordered delivery, batches, suspension, and the adaptive rate."""
from __future__ import annotations

import trio

from broker.hermes.push import AdaptiveRate

from .test_http import make_subscription, make_topic

FAST = {"messageBackoff": 10, "rate": 2000}


async def publish(http, n: int, topic="shop.orders"):
    for i in range(n):
        r = await http.post(f"/topics/{topic}", content=b'{"n": %d}' % i)
        assert r.status_code == 201, r.text


async def settled(q, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while q.unacked_count or q.message_count:  # noqa: ASYNC110 - the queue has no event to wait on
            await trio.sleep(0.01)


async def test_client_errors_dead_letter_or_retry(hermes_broker, endpoint):
    http = hermes_broker.http
    vhost = hermes_broker.vhost
    await make_topic(http)
    endpoint.script = [400]
    await make_subscription(http, "shop.orders", "strict", endpoint.url, subscriptionPolicy=FAST)
    await publish(http, 1)
    await settled(vhost.queues["shop.orders.strict"])
    assert [r.status for r in endpoint.received] == [400]
    dead = vhost.queues["shop.orders.strict.dead"]
    [entry] = list(dead.ready)
    assert entry.message.body == b'{"n": 0}'
    assert entry.message.headers["x-death"][0]["reason"] == b"rejected" or \
        entry.message.headers["x-death"][0]["reason"] == "rejected"
    # with retryClientErrors a 4xx is retried like a 5xx
    endpoint.received.clear()
    endpoint.script = [404, 429]
    await http.put("/topics/shop.orders/subscriptions/strict",
                   json={"subscriptionPolicy": {"retryClientErrors": True}})
    await publish(http, 1)
    await endpoint.wait_for(lambda e: len(e.ok) == 1)
    assert [r.status for r in endpoint.received] == [404, 429, 200]
    assert dead.message_count == 1


async def test_ttl_then_dead_letter(hermes_broker, endpoint):
    http = hermes_broker.http
    vhost = hermes_broker.vhost
    await make_topic(http)
    endpoint.default = 500
    await make_subscription(http, "shop.orders", "ttl", endpoint.url,
                            subscriptionPolicy={"messageBackoff": 100, "messageTtl": 1, "rate": 100})
    await publish(http, 1)
    await settled(vhost.queues["shop.orders.ttl"], within=5)
    # ~1 s of retries at 100 ms, then dead-lettered: nothing lost
    assert 5 <= len(endpoint.received) <= 12, len(endpoint.received)
    assert vhost.queues["shop.orders.ttl.dead"].message_count == 1


async def test_retry_after_and_timeouts(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http)
    endpoint.script = [(503, 0, {"Retry-After": "0.3"}), (200, 0.5), 200]
    await make_subscription(http, "shop.orders", "slow", endpoint.url,
                            subscriptionPolicy={**FAST, "requestTimeout": 200, "ordered": True})
    t0 = trio.current_time()
    await publish(http, 1)
    await endpoint.wait_for(lambda e: len(e.received) == 3)
    await settled(hermes_broker.vhost.queues["shop.orders.slow"])
    # 503 waited its Retry-After; the slow 200 came after the client's timeout: delivered again
    assert trio.current_time() - t0 >= 0.3
    assert sorted(r.headers["hermes-retry-count"] for r in endpoint.received) == ["0", "1", "2"]
    pusher = hermes_broker.hermes.subscribers["shop.orders$slow"]
    assert pusher.stats["delivered"] == 1 and pusher.stats["retries"] == 2


async def test_inflight_window_and_order(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http)
    endpoint.default = (200, 0.05)
    await make_subscription(http, "shop.orders", "par", endpoint.url,
                            subscriptionPolicy={**FAST, "inflightSize": 3})
    await make_subscription(http, "shop.orders", "ord", endpoint.url.replace("hook", "ord"),
                            subscriptionPolicy={**FAST, "ordered": True})
    q = hermes_broker.vhost.queues["shop.orders.par"]
    await publish(http, 12)
    peak = 0
    with trio.fail_after(10):
        while len(endpoint.ok) < 24:
            peak = max(peak, q.unacked_count)
            await trio.sleep(0.005)
    assert peak <= 3
    ordered = [r.body for r in endpoint.received if r.path == "/ord"]
    assert ordered == [b'{"n": %d}' % i for i in range(12)]


async def test_batch_delivery(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http, ack="LEADER")  # 202 at once: publishes do not wait for fsyncs
    await make_subscription(http, "shop.orders", "batch", endpoint.url, deliveryType="BATCH",
                            subscriptionPolicy=FAST,
                            batchSubscriptionPolicy={"batchSize": 5, "batchTime": 300})
    for i in range(7):
        assert (await http.post("/topics/shop.orders", content=b'{"n": %d}' % i)).status_code == 202
    await endpoint.wait_for(lambda e: sum(len(eval_json(r.body)) for r in e.ok) == 7)
    sizes = [len(eval_json(r.body)) for r in endpoint.ok]
    assert max(sizes) <= 5 and sum(sizes) == 7 and len(sizes) <= 3, sizes
    first = eval_json(endpoint.ok[0].body)[0]
    assert first["message"] == {"n": 0} and len(first["metadata"]["id"]) == 36
    assert "hermes-batch-id" in endpoint.ok[0].headers


def eval_json(body: bytes):
    import json
    return json.loads(body)


async def test_suspend_and_activate(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http)
    await make_subscription(http, "shop.orders", "s", endpoint.url, subscriptionPolicy=FAST)
    r = await http.put("/topics/shop.orders/subscriptions/s/state", content=b'"SUSPENDED"')
    assert r.status_code == 200 and r.json()["state"] == "SUSPENDED"
    await publish(http, 3)
    await trio.sleep(0.2)
    assert endpoint.received == []
    assert hermes_broker.vhost.queues["shop.orders.s"].message_count == 3
    await http.put("/topics/shop.orders/subscriptions/s/state", content=b'"ACTIVE"')
    await endpoint.wait_for(lambda e: len(e.ok) == 3)
    r = await http.get("/topics/shop.orders/subscriptions/s/metrics")
    assert r.json()["delivered"] == 3


async def test_adaptive_rate():
    rate = AdaptiveRate(100.0)
    for _ in range(3):
        rate.failure()
    assert rate.rate == 12.5
    for _ in range(20):
        rate.success()
    assert rate.rate == 100.0
    t0 = trio.current_time()
    for _ in range(11):
        await rate.acquire()
    assert 0.09 <= trio.current_time() - t0 < 0.5  # 10 intervals of 10 ms


async def test_subscription_queue_deleted_over_amqp(hermes_broker, endpoint):
    http = hermes_broker.http
    vhost = hermes_broker.vhost
    await make_topic(http)
    await make_subscription(http, "shop.orders", "s", endpoint.url, subscriptionPolicy=FAST)
    vhost.delete_queue_checked("shop.orders.s", None)
    with trio.fail_after(5):
        while "shop.orders$s" in hermes_broker.hermes.subscribers:  # noqa: ASYNC110 - the pusher stops on its own
            await trio.sleep(0.01)
    # any update starts it again, on a queue declared again and bound to the topic
    r = await http.put("/topics/shop.orders/subscriptions/s", json={"description": "again"})
    assert r.status_code == 200
    await publish(http, 1)
    await endpoint.wait_for(lambda e: len(e.ok) == 1)


async def test_retention_expires_unread_messages(hermes_broker):
    http = hermes_broker.http
    vhost = hermes_broker.vhost
    await make_topic(http, name="shop.short", retentionTime={"duration": 1, "retentionUnit": "SECONDS"})
    await make_subscription(http, "shop.short", "idle", "http://127.0.0.1:9/", state="SUSPENDED")
    await publish(http, 2, topic="shop.short")
    q, dead = vhost.queues["shop.short.idle"], vhost.queues["shop.short.idle.dead"]
    assert q.opts.message_ttl == dead.opts.message_ttl == 1000
    with trio.fail_after(10):
        while dead.message_count < 2:  # noqa: ASYNC110 - the queue has no event to wait on
            await trio.sleep(0.05)
    assert q.message_count == 0
    reason = next(iter(dead.ready)).message.headers["x-death"][0]["reason"]
    assert reason in ("expired", b"expired")
    r = await http.put("/topics/shop.short", json={"retentionTime": {"duration": 2,
                                                                     "retentionUnit": "HOURS"}})
    assert r.status_code == 200, r.text
    assert q.opts.message_ttl == dead.opts.message_ttl == 2 * 3600 * 1000
    r = await http.put("/topics/shop.short", json={"retentionTime": {"duration": 50,
                                                                     "retentionUnit": "DAYS"}})
    assert r.status_code == 400 and r.json()["message"].startswith("retentionTime: at most 49 days")
