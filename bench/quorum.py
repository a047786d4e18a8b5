"""Quorum against classic queues on one broker: publish, consume and dead-letter rates.

    .venv/bin/python -m bench.quorum --url amqp://guest:guest@127.0.0.1:5672/ [-n 3000]

For each queue kind (classic durable, quorum; then quorum dead-lettering at-most-once and
at-least-once) it publishes ``n`` persistent messages with publisher confirms (a window of
``--window`` unconfirmed, through pika's SelectConnection), consumes them with manual acks
(prefetch 200), and, for the dead-letter rows, rejects them into a DLX queue and waits
until all arrived. Prints one markdown row per kind. Short by design (a shared machine):
a few seconds per row.
"""
from __future__ import annotations

import argparse
import time
import uuid

import pika

Q = {"x-queue-type": "quorum"}


def _publish(url: str, queue: str, n: int, window: int, body: bytes) -> float:
    """Seconds to publish ``n`` persistent messages with at most ``window`` unconfirmed."""
    conn = pika.SelectConnection(pika.URLParameters(url))
    state = {"sent": 0, "acked": 0, "t0": 0.0, "t1": 0.0, "ch": None}
    props = pika.BasicProperties(delivery_mode=2)

    def pump():
        ch = state["ch"]
        while state["sent"] < n and state["sent"] - state["acked"] < window:
            ch.basic_publish("", queue, body, props)
            state["sent"] += 1

    def on_confirm(frame):
        m = frame.method
        if isinstance(m, pika.spec.Basic.Nack):
            raise RuntimeError("nacked")
        state["acked"] = m.delivery_tag if m.multiple else state["acked"] + 1
        if state["acked"] >= n:
            state["t1"] = time.perf_counter()
            conn.close()
        else:
            pump()

    def on_channel(ch):
        state["ch"] = ch
        ch.confirm_delivery(on_confirm, callback=lambda _f: start())

    def start():
        state["t0"] = time.perf_counter()
        pump()

    conn.add_on_open_callback(lambda c: c.channel(on_open_callback=on_channel))
    conn.add_on_close_callback(lambda *_a: conn.ioloop.stop())
    conn.ioloop.start()
    return state["t1"] - state["t0"]


def _consume(ch, queue: str, n: int, reject: bool = False) -> float:
    ch.basic_qos(prefetch_count=200)
    t0 = time.perf_counter()
    for got, (method, _p, _b) in enumerate(ch.consume(queue, inactivity_timeout=10), 1):
        if method is None:
            raise RuntimeError(f"{queue}: only {got - 1} of {n} arrived")
        if reject:
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
        if got == n:
            break
    ch.cancel()
    return time.perf_counter() - t0


def _wait_count(ch, queue: str, n: int, timeout: float = 60.0) -> float:
    t0 = time.perf_counter()
    while ch.queue_declare(queue, passive=True).method.message_count < n:
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{queue}: dead letters missing after {timeout}s")
        ch.connection.sleep(0.01)
    return time.perf_counter() - t0


def run(url: str, n: int, window: int, size: int) -> list[tuple]:
    body = b"x" * size
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    rows = []
    tag = uuid.uuid4().hex[:6]
    for kind, args in (("classic", {}), ("quorum", Q)):
        q = f"bench-{kind}-{tag}"
        ch.queue_declare(q, durable=True, arguments=args)
        pub = _publish(url, q, n, window, body)
        con = _consume(ch, q, n)
        ch.queue_delete(q)
        rows.append((kind, n / pub, n / con, None))
    for strategy in ("at-most-once", "at-least-once"):
        src, dlx, dead = (f"bench-dl-{strategy}-{tag}", f"bench-dlx-{tag}",
                          f"bench-dead-{strategy}-{tag}")
        ch.exchange_declare(dlx, "fanout", durable=True)
        ch.queue_declare(dead, durable=True, arguments=Q)
        ch.queue_bind(dead, dlx)
        ch.queue_declare(src, durable=True, arguments={
            **Q, "x-dead-letter-exchange": dlx, "x-dead-letter-strategy": strategy,
            "x-overflow": "reject-publish"})
        pub = _publish(url, src, n, window, body)
        t0 = time.perf_counter()
        _consume(ch, src, n, reject=True)
        _wait_count(ch, dead, n)
        dl = time.perf_counter() - t0
        for name in (src, dead):
            ch.queue_delete(name)
        ch.exchange_delete(dlx)
        rows.append((f"quorum, dead-letter {strategy}", n / pub, None, n / dl))
    conn.close()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quorum", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("-n", type=int, default=3000, help="messages per row")
    p.add_argument("--window", type=int, default=200, help="unconfirmed publishes at most")
    p.add_argument("--size", type=int, default=256, help="body bytes")
    a = p.parse_args(argv)
    print(f"| queue | publish msg/s (confirmed, persistent) | consume msg/s (acked) | "
          f"reject → DLX queue msg/s |  (n={a.n}, window={a.window}, {a.size} B)")
    print("| --- | --- | --- | --- |")
    for kind, pub, con, dl in run(a.url, a.n, a.window, a.size):
        cells = [f"{v:,.0f}" if v is not None else "-" for v in (pub, con, dl)]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
