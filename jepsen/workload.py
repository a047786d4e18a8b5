"""Producers publishing unique ids with publisher confirms, consumers acking, both with
pika and the cluster's whole address list (pika tries each in turn, as a client with a
failover list does). Every outcome is recorded with its monotonic time."""
from __future__ import annotations

import itertools
import threading
import time
from collections import Counter

import pika
import pika.exceptions as px

_PERSISTENT = pika.BasicProperties(delivery_mode=2)


def parameters(addresses, heartbeat: int = 2) -> list[pika.ConnectionParameters]:
    return [pika.ConnectionParameters(host, port, heartbeat=heartbeat, connection_attempts=1,
                                      socket_timeout=2, blocked_connection_timeout=10,
                                      stack_timeout=5)
            for host, port in addresses]


class History:
    """What every client saw; thread-safe appends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent: dict[str, float] = {}
        self.confirmed: dict[str, float] = {}
        self.nacked: dict[str, float] = {}
        self.doubted: dict[str, float] = {}  # the connection broke while its confirm was due
        self.consumed: Counter[str] = Counter()
        self.redelivered: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()  # why client connections ended
        self.last_consumed = time.monotonic()

    def error(self, who: str, exc: BaseException) -> None:
        with self.lock:
            self.errors[f"{who}: {type(exc).__name__}: {exc}"[:160]] += 1

    def first_confirm_after(self, t: float) -> float | None:
        with self.lock:
            later = [c for c in self.confirmed.values() if c > t]
        return min(later) if later else None

    def confirm_gap(self, t_fault: float, resumed_after: float) -> tuple[float, float] | None:
        """The longest stretch without any confirm that spans the fault (a confirm already
        on its way when the fault hit does not count as service), as (gap, fault -> end of
        the gap); None until a confirm came after ``resumed_after``."""
        with self.lock:
            times = sorted(c for c in self.confirmed.values() if c > t_fault - 5)
        if not times or times[-1] <= resumed_after:
            return None
        best = None
        for a, b in itertools.pairwise(times):
            if b >= t_fault and a <= resumed_after and (best is None or b - a > best[0]):
                best = (b - a, b - t_fault)
        return best


class Producer(threading.Thread):
    def __init__(self, index: int, addresses, queues: list[str], history: History,
                 arguments: dict | None = None):
        super().__init__(daemon=True, name=f"producer-{index}")
        self.index = index
        self.arguments = arguments  # the queues' declare arguments (x-queue-type)
        self.params = parameters(addresses)
        self.queues = queues
        self.history = history
        self.stop_event = threading.Event()
        self.counter = itertools.count()
        self.reconnects = 0

    def run(self) -> None:
        h = self.history
        while not self.stop_event.is_set():
            try:
                conn = pika.BlockingConnection(self.params)
            except Exception:  # pika's connection workflow has errors outside AMQPError
                time.sleep(0.1)
                continue
            self.reconnects += 1
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                for q in self.queues:
                    ch.queue_declare(q, durable=True, arguments=self.arguments)
                while not self.stop_event.is_set():
                    n = next(self.counter)
                    ident = f"p{self.index}-{n}"
                    queue = self.queues[n % len(self.queues)]
                    with h.lock:
                        h.sent[ident] = time.monotonic()
                    try:
                        ch.basic_publish("", queue, ident.encode(), _PERSISTENT)
                    except px.NackError:
                        with h.lock:
                            h.nacked[ident] = time.monotonic()
                        continue
                    except Exception:
                        with h.lock:
                            h.doubted[ident] = time.monotonic()
                        raise
                    with h.lock:
                        h.confirmed[ident] = time.monotonic()
            except Exception as exc:  # the connection broke: reconnect (the id is in doubt)
                h.error("producer", exc)
            finally:
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:
                    pass


class Consumer(threading.Thread):
    def __init__(self, index: int, addresses, queues: list[str], history: History,
                 prefetch: int = 50, arguments: dict | None = None):
        super().__init__(daemon=True, name=f"consumer-{index}")
        self.arguments = arguments
        self.params = parameters(addresses)
        self.queues = queues
        self.history = history
        self.prefetch = prefetch
        self.stop_event = threading.Event()

    def _on_message(self, ch, method, props, body) -> None:
        h = self.history
        ident = body.decode()
        with h.lock:
            h.consumed[ident] += 1
            if method.redelivered:
                h.redelivered[ident] += 1
            h.last_consumed = time.monotonic()
        ch.basic_ack(method.delivery_tag)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn = pika.BlockingConnection(self.params)
            except Exception:  # pika's connection workflow has errors outside AMQPError
                time.sleep(0.1)
                continue
            try:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=self.prefetch)
                for q in self.queues:
                    ch.queue_declare(q, durable=True, arguments=self.arguments)
                    ch.basic_consume(q, self._on_message)
                while not self.stop_event.is_set():
                    conn.process_data_events(time_limit=0.2)
            except Exception as exc:  # the connection broke: reconnect; unacked ones come again
                self.history.error("consumer", exc)
            finally:
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:
                    pass


def finish(clients, history: History, idle: float, limit: float = 60.0) -> None:
    """End a run: stop the producers, then let the consumers drain until nothing arrived
    for ``idle`` seconds (at most ``limit``)."""
    producers = [c for c in clients if isinstance(c, Producer) or "producer" in c.name]
    for p in producers:
        p.stop_event.set()
    for p in producers:
        p.join(30)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with history.lock:
            quiet = time.monotonic() - history.last_consumed
        if quiet > idle:
            break
        time.sleep(0.2)


def stop(clients) -> None:
    """Stop every client thread (producers and consumers)."""
    for c in clients:
        c.stop_event.set()
    for c in clients:
        c.join(15)
