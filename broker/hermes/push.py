"""Push delivery of one subscription to its HTTP endpoint (Hermes' consumer).

A ``PushSubscriber`` is a consumer of the subscription's durable queue whose "channel" is
itself: the queue dispatches to it as to any AMQP consumer, within its prefetch (the
in-flight window), and it acknowledges an entry only after the endpoint answered 2xx -- so
nothing is delivered twice to an endpoint that said 2xx, except after a crash (the entry
then comes back redelivered).

Tasks: ``run`` is the subscription's one task; it owns a nursery with a fixed pool of
senders (``inflightSize`` for parallel delivery, one when ordered or batched), which end
with it, each with its own keep-alive connection (``client.Connection``). No task per
message: deliveries go through a bounded memory channel.

Per message (or batch): wait for the adaptive rate limiter, POST with Hermes' headers; 2xx
acks; 5xx, timeouts and network errors retry after the backoff and slow the limiter down
(503 with Retry-After waits that long without slowing it); 4xx is retried only with
``retryClientErrors``. A message still undelivered when its in-flight TTL (``messageTtl``,
counted from its first attempt) would run out, or refused with a 4xx, is rejected: the queue
dead-letters it (to the subscription's dead-letter queue by default).

Stopping: ``drain()`` (a clean stop, an update, the broker's shutdown) takes no new entries
and sends nothing new, but lets the requests already sent finish (each within its
``requestTimeout``) and settles them, so an entry the endpoint answered 2xx is acked, never
requeued; what was not sent, or waits for a retry, goes back to the queue. ``stop()``
cancels at once (in-flight requests abandoned: their entries are requeued and may reach the
endpoint twice, as after a crash).
"""
from __future__ import annotations

import json
import logging
import math
import uuid
from typing import TYPE_CHECKING, Any

import trio

from ..queues.queue import Consumer
from ..schemas import compiled
from .client import Connection, Endpoint, PushError, Watchdog
from .model import SubscriptionDef

if TYPE_CHECKING:
    from ..queues.queue import Queue

log = logging.getLogger("broker.hermes.push")


BURST = 0.01  # s


class AdaptiveRate:
    """Requests per second between ``floor`` and ``maximum``: halved on a failure, raised by
    a quarter on each success (Hermes' rate limiter converges the same way: slow when the
    endpoint fails, back to the configured maximum as it recovers)."""

    def __init__(self, maximum: float):
        self.maximum = maximum
        self.floor = min(1.0, maximum)
        self.rate = maximum
        self._next = 0.0

    async def acquire(self) -> None:
        now = trio.current_time()
        # a burst of up to BURST seconds' worth of requests passes without sleeping
        at = max(now - BURST, self._next)
        self._next = at + 1.0 / self.rate
        if at > now:
            await trio.sleep(at - now)

    def success(self) -> None:
        if self.rate < self.maximum:
            self.rate = min(self.maximum, self.rate * 1.25 + 1.0)

    def failure(self) -> None:
        self.rate = max(self.floor, self.rate / 2)


def _retry_after(headers: dict) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class PushSubscriber:
    """Consumer of ``queue`` pushing to ``sub.endpoint``; ``run()`` is its task.

    Contract: ``run`` returns when ``stop()`` is called, the queue is deleted, or its
    cancel scope is cancelled. On the way out, every entry it holds and has not settled
    goes back to the queue (requeued, redelivered) before its consumer leaves. It owns its
    sender tasks and their connections; the queue and the service are not its own.
    """

    global_prefetch = 0  # read by Consumer.can_take as a channel's
    metrics_protocol = None  # HTTP deliveries are in the subscription's own metrics

    def __init__(self, service: Any, sub: SubscriptionDef, topic_schema: str | None, queue: Queue):
        self.service = service
        self.sub = sub
        self.queue = queue
        self.schema = compiled(topic_schema) if topic_schema else None
        policy = sub.subscriptionPolicy
        self.batch = sub.deliveryType == "BATCH"
        self.workers = 1 if (self.batch or policy.ordered) else policy.inflightSize
        window = sub.batchSubscriptionPolicy.batchSize if self.batch else policy.inflightSize
        self.limiter = AdaptiveRate(policy.rate)
        self.endpoint = Endpoint(sub.endpoint)
        # request timeouts to within a tenth of requestTimeout (at least 5 ms, at most 100 ms)
        self.watchdog = Watchdog(min(0.1, max(0.005, policy.requestTimeout / 10000.0)))
        self.consumer = Consumer(f"hermes.{sub.qualified}", self, queue, no_ack=False,
                                 exclusive=False, priority=0, prefetch=window, arguments={})
        self._send, self._receive = trio.open_memory_channel[Any](window)
        self._held: dict[int, Any] = {}  # id(entry) -> entry: delivered here, not settled
        self._scope = trio.CancelScope()
        self.closed = False
        self.draining = False
        self._drain_event = trio.Event()
        self.finished = trio.Event()
        sub_headers = "".join(f"{h['name']}: {h['value']}\r\n" for h in sub.headers)
        # the header lines every request of this subscription carries, formatted once
        self._static_headers = (f"Hermes-Topic-Name: {sub.topicName}\r\n"
                                f"Hermes-Subscription-Name: {sub.name}\r\n{sub_headers}")
        self.stats = {"delivered": 0, "failed": 0, "discarded": 0, "retries": 0}

    # ---- what the queue needs of a consumer's channel ----
    @property
    def session(self) -> PushSubscriber:
        """No connection: it is its own (its metrics label, as a consumer's)."""
        return self

    @property
    def can_deliver(self) -> bool:
        return not self.closed

    @property
    def unacked_count(self) -> int:
        return len(self._held)

    def deliver(self, consumer: Consumer, queue: Queue, entry) -> None:
        self._held[id(entry)] = entry
        try:
            self._send.send_nowait(entry)  # never full: the prefetch is the channel's capacity
        except trio.ClosedResourceError:
            pass  # draining: held, so requeued by _release

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.closed = True  # the queue was deleted
        self._scope.cancel()

    # ---- life cycle ----
    def stop(self) -> None:
        self._scope.cancel()

    def drain(self) -> None:
        """Stop taking entries; ``run`` returns once the requests in flight are settled."""
        if self.draining:
            return
        self.draining = True
        self.closed = True  # the queue delivers nothing more to us
        self._drain_event.set()
        self._send.close()  # idle senders see the end of the channel and leave

    async def run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self.queue.add_consumer(self.consumer)
                    async with trio.open_nursery() as senders:
                        nursery.start_soon(self.watchdog.run)
                        for _ in range(self.workers):
                            senders.start_soon(self._batch_sender if self.batch else self._sender)
                    nursery.cancel_scope.cancel()  # the senders are done: so is the watchdog
        finally:
            self._release()
            self.finished.set()

    def _release(self) -> None:
        self.closed = True
        q = self.queue
        held = list(self._held.values())
        self._held.clear()
        if not q.deleted:
            if held:
                held.sort(key=lambda e: -e.seq)
                q.requeue([(entry, self.consumer) for entry in held])
            q.remove_consumer(self.consumer)

    # ---- settlement ----
    def _settle(self, entries: list, ok: bool) -> None:
        q = self.queue
        for entry in entries:
            if self._held.pop(id(entry), None) is None or q.deleted:
                continue
            if ok:
                q.ack(entry, self.consumer)
            else:
                q.reject(entry, self.consumer)  # dead-lettered by the queue's DLX
        if not q.deleted and q.consumers:
            q.dispatch()

    # ---- sending ----
    def _headers(self, message_id: str, retries: int, ctype: str, extra: str = "") -> str:
        return (f"Hermes-Message-Id: {message_id}\r\nHermes-Retry-Count: {retries}\r\n"
                f"Content-Type: {ctype}\r\n{extra}{self._static_headers}")

    def _payload(self, message) -> tuple[bytes, str]:
        """The body as the subscription wants it: AVRO topics' binary becomes JSON for
        JSON subscriptions."""
        ctype = message.properties.get("content_type") or "application/json"
        if self.schema is not None and self.sub.contentType == "JSON" and ctype == "avro/binary":
            return json.dumps(self.schema.to_json(message.body)).encode(), "application/json"
        return message.body, ctype

    @staticmethod
    def message_id(message) -> str:
        mid = message.properties.get("message_id")
        if mid:
            return mid
        return str(uuid.uuid5(uuid.NAMESPACE_OID, f"triomq.{message.id}"))

    async def _sender(self) -> None:
        conn = Connection(self.endpoint, self.watchdog)
        try:
            await self._send_each(conn)
        finally:
            await conn.aclose()

    async def _send_each(self, conn: Connection) -> None:
        async for entry in self._receive:
            if self.draining:
                continue  # held: requeued by _release
            message = entry.message
            try:
                body, ctype = self._payload(message)
            except Exception as exc:  # an AMQP publish the topic's schema cannot read
                log.warning("subscription %s: cannot convert message: %s", self.sub.qualified, exc)
                self.stats["discarded"] += 1
                self._settle([entry], ok=False)
                continue
            mid = self.message_id(message)
            ok = await self._deliver(conn, body, lambda n, mid=mid, ct=ctype: self._headers(mid, n, ct))
            if ok is not None:
                self._settle([entry], ok)

    async def _batch_sender(self) -> None:
        conn = Connection(self.endpoint, self.watchdog)
        try:
            await self._send_batches(conn)
        finally:
            await conn.aclose()

    async def _send_batches(self, conn: Connection) -> None:
        bp = self.sub.batchSubscriptionPolicy
        while True:
            try:
                batch = [await self._receive.receive()]
            except trio.EndOfChannel:
                return  # draining
            volume = len(batch[0].message.body)
            with trio.move_on_after(bp.batchTime / 1000.0):
                while len(batch) < bp.batchSize and volume < bp.batchVolume:
                    try:
                        entry = await self._receive.receive()
                    except trio.EndOfChannel:
                        break
                    batch.append(entry)
                    volume += len(entry.message.body)
            while True:  # what is already waiting joins without waiting for batchTime
                if len(batch) >= bp.batchSize or volume >= bp.batchVolume:
                    break
                try:
                    entry = self._receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                batch.append(entry)
                volume += len(entry.message.body)
            items = []
            keep = []
            for entry in batch:
                try:
                    body, _ctype = self._payload(entry.message)
                    message = json.loads(body)
                except Exception:
                    message = entry.message.body.decode("utf-8", "replace")
                items.append({"message": message,
                              "metadata": {"id": self.message_id(entry.message)}})
                keep.append(entry)
            if self.draining:
                return  # held: requeued by _release
            batch_id = str(uuid.uuid4())

            def headers(n: int, batch_id=batch_id) -> str:
                return self._headers(batch_id, n, "application/json",
                                     f"Hermes-Batch-Id: {batch_id}\r\n")

            ok = await self._deliver(conn, json.dumps(items).encode(), headers)
            if ok is None:
                return
            self._settle(keep, ok)

    async def _deliver(self, conn: Connection, body: bytes, headers) -> bool | None:
        """POST until a 2xx (True) or until the message must be discarded (False); None when
        a drain began before a request went out (the entry stays unsettled: requeued)."""
        policy = self.sub.subscriptionPolicy
        first = trio.current_time()
        ttl = policy.messageTtl
        backoff = policy.messageBackoff / 1000.0
        timeout = policy.requestTimeout / 1000.0
        retries = 0
        while True:
            await self.limiter.acquire()
            if self.draining:
                return None
            wait = None
            try:
                status, rheaders = await conn.post(body, headers(retries), timeout)
                if status == 503:
                    wait = _retry_after(rheaders)
            except (PushError, trio.TooSlowError) as exc:
                status = 0
                log.debug("subscription %s: %r", self.sub.qualified, exc)
            if 200 <= status < 300:
                self.limiter.success()
                self.stats["delivered"] += 1
                return True
            self.stats["failed"] += 1
            if wait is None:
                self.limiter.failure()
            if 400 <= status < 500 and not policy.retryClientErrors:
                self.stats["discarded"] += 1
                return False
            delay = wait if wait is not None else min(
                backoff * policy.backoffMultiplier ** retries, policy.backoffMaxIntervalInSec)
            if trio.current_time() + delay - first > ttl:
                self.stats["discarded"] += 1
                return False
            retries += 1
            self.stats["retries"] += 1
            with trio.move_on_after(delay):
                await self._drain_event.wait()  # a drain ends the wait: nothing more is sent
