"""Failover of a mirrored queue as three different client libraries see it, on a REAL etcd:
a kombu producer with publisher confirms (``confirm_publish``) and an aio-pika consumer
(``connect_robust``) keep working through a kill -9 of the queue's master, and every
message kombu saw confirmed is consumed; a pika consumer that asked for
``x-cancel-on-ha-failover`` is sent basic.cancel, as RabbitMQ does."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from .test_cluster_nodes import eventually, node
from .test_mirroring import AUTH, queue_view

QUEUE = "ha.fo"
TOTAL = 400


class Producer(threading.Thread):
    """kombu, confirms on, publishing ids 0..TOTAL-1 through node ``port``; an id whose
    publish failed (nack, timeout, a lost connection) is published again, as an application
    would, so ``confirmed`` holds every id kombu returned from without an error for."""

    def __init__(self, port: int, kill_after: int, killed: threading.Event):
        super().__init__(daemon=True)
        self.port, self.kill_after, self.killed = port, kill_after, killed
        self.confirmed: set[int] = set()
        self.failures = 0
        self.error: BaseException | None = None
        self.ready_to_kill = threading.Event()

    def run(self) -> None:
        from kombu import Connection
        try:
            with Connection(f"amqp://guest:guest@127.0.0.1:{self.port}//",
                            transport_options={"confirm_publish": True}) as conn:
                producer = conn.Producer(serializer="raw")
                i = 0
                deadline = time.monotonic() + 60
                while i < TOTAL and time.monotonic() < deadline:
                    try:
                        producer.publish(str(i).encode(), exchange="", routing_key=QUEUE,
                                         delivery_mode=2, timeout=10)
                    except Exception:
                        self.failures += 1
                        time.sleep(0.2)
                        conn.ensure_connection(max_retries=10)
                        producer = conn.Producer(serializer="raw")
                        continue
                    self.confirmed.add(i)
                    i += 1
                    if i == self.kill_after:
                        self.ready_to_kill.set()
                    if not self.killed.is_set():
                        time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.error = exc


class RobustConsumer(threading.Thread):
    """aio-pika, connect_robust, manual acks, on node ``port``."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.got: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._consume())
        except BaseException as exc:
            self.error = exc

    async def _consume(self) -> None:
        import aio_pika
        conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{self.port}/")
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=50)
            queue = await ch.declare_queue(QUEUE, durable=True, passive=True)

            async def on_message(message) -> None:
                self.got.append((int(message.body), time.monotonic()))
                await message.ack()

            await queue.consume(on_message)
            # the stop flag is set from the test's thread: polled, not awaited
            while not self.stop.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.05)


@pytest.mark.timeout(150)
def test_kombu_and_aio_pika_through_a_master_kill9(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    consumer = None
    try:
        r = httpx.put(f"{a.http_url}/api/policies/%2F/ha", auth=AUTH, json={
            "pattern": "^ha\\.", "definition": {"ha-mode": "all"}, "apply-to": "queues"})
        assert r.status_code in (201, 204), r.text
        ca = a.connect()
        ca.channel().queue_declare(QUEUE, durable=True)  # client-local: the master is a
        ca.close()
        def placed():
            view = queue_view(etcd, QUEUE)
            assert view["master"] == "a" and view["in_sync"] == ["b"], view
        eventually(placed, timeout=15)

        # every client on b, the node that survives
        consumer = RobustConsumer(b.port)
        consumer.start()
        cancelled = threading.Event()
        cb = b.connect()
        chc = cb.channel()
        chc.add_on_cancel_callback(lambda frame: cancelled.set())
        chc.basic_qos(prefetch_count=1)
        cancel_got: list[int] = []

        def on_message(ch, method, _props, body):
            cancel_got.append(int(body))
            ch.basic_ack(method.delivery_tag)

        chc.basic_consume(QUEUE, on_message, arguments={"x-cancel-on-ha-failover": True})

        killed = threading.Event()
        producer = Producer(b.port, kill_after=150, killed=killed)
        producer.start()
        deadline = time.monotonic() + 60
        while not producer.ready_to_kill.is_set() and time.monotonic() < deadline:
            cb.process_data_events(0.05)
        assert producer.ready_to_kill.is_set(), producer.error
        epoch = queue_view(etcd, QUEUE)["epoch"]
        a.kill()
        t_kill = time.monotonic()
        killed.set()

        while producer.is_alive() or (time.monotonic() < t_kill + 40 and not cancelled.is_set()):
            cb.process_data_events(0.05)
            if time.monotonic() > t_kill + 90:
                break
        assert producer.error is None, producer.error
        assert producer.confirmed == set(range(TOTAL)), "kombu gave up on some ids"
        view = queue_view(etcd, QUEUE)
        assert view["master"] == "b" and view["epoch"] > epoch

        # the pika consumer that asked for it was cancelled by the broker
        assert cancelled.is_set()

        # every confirmed id is consumed; the robust consumer kept going after the kill
        def all_consumed():
            seen = {i for i, _ in consumer.got} | set(cancel_got)
            missing = producer.confirmed - seen
            assert not missing, f"{len(missing)} confirmed ids not consumed: {sorted(missing)[:10]}"
        eventually(all_consumed, timeout=30)
        assert any(t > t_kill for _, t in consumer.got), "aio-pika got nothing after the failover"
        assert consumer.error is None, consumer.error
        cb.close()
    finally:
        if consumer is not None:
            consumer.stop.set()
            consumer.join(10)
        b.stop()
        a.stop()
