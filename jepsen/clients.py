"""The workload's producers and consumers with kombu and aio-pika (``--client``), beside
pika's in ``workload.py``: the same unique ids, publisher confirms, one publish at a time,
manual acks, the cluster's whole address list, and the same ``History``. Each client
reconnects by itself after a connection error, to the next address that answers."""
from __future__ import annotations

import asyncio
import itertools
import threading
import time

# imported here, once: kombu's lazy attributes are not safe to import from several
# threads at once (AttributeError: module 'kombu' has no attribute 'Connection')
import aio_pika
import kombu
from aio_pika.exceptions import DeliveryError
from amqp.exceptions import MessageNacked  # type: ignore[import-untyped]

from .workload import History


def _urls(addresses) -> list[str]:
    return [f"amqp://guest:guest@{host}:{port}/" for host, port in addresses]


class _Client(threading.Thread):
    def __init__(self, kind: str, index: int, addresses, queues: list[str], history: History,
                 arguments: dict | None = None, prefetch: int = 50):
        super().__init__(daemon=True, name=f"{kind}-{index}")
        self.index = index
        self.urls = _urls(addresses)
        self.queues = queues
        self.history = history
        self.arguments = arguments
        self.prefetch = prefetch
        self.stop_event = threading.Event()
        self.counter = itertools.count()

    def _record(self, table: dict, ident: str) -> None:
        with self.history.lock:
            table[ident] = time.monotonic()

    def _consumed(self, ident: str, redelivered: bool) -> None:
        h = self.history
        with h.lock:
            h.consumed[ident] += 1
            if redelivered:
                h.redelivered[ident] += 1
            h.last_consumed = time.monotonic()


# ---- kombu (py-amqp underneath): confirm_publish, a failover list of URLs ----
class KombuProducer(_Client):
    def __init__(self, index: int, addresses, queues, history, arguments=None):
        super().__init__("kombu-producer", index, addresses, queues, history, arguments)

    def run(self) -> None:
        h = self.history
        while not self.stop_event.is_set():
            conn = kombu.Connection(";".join(self.urls), heartbeat=2, connect_timeout=2,
                                    failover_strategy="round-robin",
                                    transport_options={"confirm_publish": True})
            try:
                conn.ensure_connection(max_retries=1)
                channel = conn.channel()
                queues = [kombu.Queue(q, routing_key=q, durable=True,
                                      queue_arguments=self.arguments, channel=channel)
                          for q in self.queues]
                for q in queues:
                    q.declare()
                producer = kombu.Producer(channel, exchange=kombu.Exchange(""))
                while not self.stop_event.is_set():
                    n = next(self.counter)
                    ident = f"k{self.index}-{n}"
                    self._record(h.sent, ident)
                    try:
                        # returns once the broker confirmed (confirm_publish)
                        producer.publish(ident.encode(), routing_key=self.queues[n % len(self.queues)],
                                         delivery_mode=2, retry=False)
                    except MessageNacked:
                        self._record(h.nacked, ident)
                        continue
                    except Exception:
                        self._record(h.doubted, ident)
                        raise
                    self._record(h.confirmed, ident)
            except Exception as exc:  # the connection broke: reconnect (the id is in doubt)
                h.error("producer", exc)
                time.sleep(0.1)
            finally:
                try:
                    conn.release()
                except Exception:
                    pass


class KombuConsumer(_Client):
    def __init__(self, index: int, addresses, queues, history, arguments=None, prefetch=50):
        super().__init__("kombu-consumer", index, addresses, queues, history, arguments,
                         prefetch)

    def _on_message(self, body, message) -> None:
        ident = body.decode() if isinstance(body, bytes) else str(body)
        self._consumed(ident, bool(message.delivery_info.get("redelivered")))
        message.ack()

    def run(self) -> None:
        while not self.stop_event.is_set():
            conn = kombu.Connection(";".join(self.urls), heartbeat=2, connect_timeout=2,
                                    failover_strategy="round-robin")
            try:
                conn.ensure_connection(max_retries=1)
                channel = conn.channel()
                queues = [kombu.Queue(q, routing_key=q, durable=True,
                                      queue_arguments=self.arguments) for q in self.queues]
                consumer = kombu.Consumer(channel, queues=queues, callbacks=[self._on_message],
                                          accept=None, prefetch_count=self.prefetch)
                consumer.consume()
                last_beat = time.monotonic()
                while not self.stop_event.is_set():
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
                    if time.monotonic() - last_beat > 0.5:
                        conn.heartbeat_check()
                        last_beat = time.monotonic()
            except Exception as exc:  # the connection broke: reconnect; unacked ones come again
                self.history.error("consumer", exc)
                time.sleep(0.1)
            finally:
                try:
                    conn.release()
                except Exception:
                    pass


# ---- aio-pika: an asyncio loop per client thread, publisher confirms ----
async def _aio_connect(urls: list[str], start: int):
    last: BaseException | None = None
    for i in range(len(urls)):
        try:
            return await asyncio.wait_for(
                aio_pika.connect(urls[(start + i) % len(urls)], heartbeat=2, timeout=2), 5)
        except Exception as exc:
            last = exc
    raise ConnectionError(f"no address answered ({last!r})")


class AioPikaProducer(_Client):
    def __init__(self, index: int, addresses, queues, history, arguments=None):
        super().__init__("aio-pika-producer", index, addresses, queues, history, arguments)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        h = self.history
        attempt = 0
        while not self.stop_event.is_set():
            attempt += 1
            try:
                conn = await _aio_connect(self.urls, attempt)
            except Exception:
                await asyncio.sleep(0.1)
                continue
            try:
                channel = await conn.channel(publisher_confirms=True)
                for q in self.queues:
                    await channel.declare_queue(q, durable=True, arguments=self.arguments)
                while not self.stop_event.is_set():
                    n = next(self.counter)
                    ident = f"a{self.index}-{n}"
                    self._record(h.sent, ident)
                    message = aio_pika.Message(ident.encode(),
                                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                    try:
                        await asyncio.wait_for(channel.default_exchange.publish(
                            message, routing_key=self.queues[n % len(self.queues)]), 30)
                    except DeliveryError:  # nacked
                        self._record(h.nacked, ident)
                        continue
                    except BaseException:
                        self._record(h.doubted, ident)
                        raise
                    self._record(h.confirmed, ident)
            except Exception as exc:  # the connection broke: reconnect (the id is in doubt)
                h.error("producer", exc)
            finally:
                try:
                    await asyncio.wait_for(conn.close(), 2)
                except BaseException:
                    pass


class AioPikaConsumer(_Client):
    def __init__(self, index: int, addresses, queues, history, arguments=None, prefetch=50):
        super().__init__("aio-pika-consumer", index, addresses, queues, history, arguments,
                         prefetch)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        attempt = 0
        while not self.stop_event.is_set():
            attempt += 1
            try:
                conn = await _aio_connect(self.urls, attempt)
            except Exception:
                await asyncio.sleep(0.1)
                continue
            try:
                channel = await conn.channel()
                await channel.set_qos(prefetch_count=self.prefetch)

                async def on_message(message) -> None:
                    self._consumed(message.body.decode(), bool(message.redelivered))
                    await message.ack()
                for q in self.queues:
                    queue = await channel.declare_queue(q, durable=True,
                                                        arguments=self.arguments)
                    await queue.consume(on_message)
                while not self.stop_event.is_set():
                    if conn.is_closed or channel.is_closed:
                        raise ConnectionError("connection closed")
                    # a lost connection is not always reported to a consumer that only
                    # waits: a round trip tells (a passive declare, bounded)
                    await asyncio.wait_for(channel.declare_queue(self.queues[0], passive=True),
                                           3)
                    await asyncio.sleep(0.5)
            except Exception as exc:  # the connection broke: reconnect; unacked ones come again
                self.history.error("consumer", exc)
            finally:
                try:
                    await asyncio.wait_for(conn.close(), 2)
                except BaseException:
                    pass


CLIENTS = {"kombu": (KombuProducer, KombuConsumer),
           "aio-pika": (AioPikaProducer, AioPikaConsumer)}
