"""Half messages: publish+commit rate vs plain persistent confirmed publishes.

    python -m bench.transactions                          # journal, 5,000 messages, windows 1 and 200
    python -m bench.transactions --store sqlite:////tmp/tx.db --count 2000
    python -m bench.transactions --windows 1,50,500

One producer connection (raw AMQP over a socket, ``rawamqp``) to a TrioMQ subprocess,
publisher confirms on, persistent 100-byte messages into a durable queue:

* ``plain``: publish ``window`` messages, wait for their confirms, repeat;
* ``half``: publish ``window`` half messages (``x-transaction: prepare``), wait for their
  confirms (the producer must know they are held before its local transaction), then
  ``window`` commits to ``amq.triomq.transaction``, wait for their confirms, repeat.

The rate is committed messages per second (each one is consumable when it is counted).
Window 1 is what a synchronous client (pika's BlockingChannel) does.
"""
from __future__ import annotations

import argparse
import time

import rawamqp as ra

from .procinfo import TrioMQProcess

CONTROL = "amq.triomq.transaction"
BODY = b"x" * 100


class Producer:
    def __init__(self, url: str):
        self.c = ra.RawAMQP("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/")), timeout=60)
        self.c.handshake()
        self.c.channel_open(1)
        self.c.confirm_select(1)
        self.seq = 0
        self.acked = 0

    def queue(self, name: str) -> None:
        self.c.queue_declare(1, name, durable=True)

    def publish(self, exchange: str, key: str, body: bytes, **props) -> None:
        self.c.publish(1, exchange, key, body, props=ra.basic_properties(**props))
        self.seq += 1

    def wait_confirms(self) -> None:
        while self.acked < self.seq:
            _ch, cm, r = self.c.read_method()
            if cm != ra.BASIC_ACK:
                raise RuntimeError(f"unexpected {cm} while waiting for confirms")
            tag = r.longlong()
            multiple = r.octet() & 1
            self.acked = tag if multiple else max(self.acked, tag)


def run_plain(p: Producer, queue: str, count: int, window: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, count, window):
        for _ in range(min(window, count - start)):
            p.publish("", queue, BODY, delivery_mode=2)
        p.wait_confirms()
    return count / (time.perf_counter() - t0)


def run_half(p: Producer, queue: str, count: int, window: int, tag: str) -> float:
    t0 = time.perf_counter()
    headers = {"x-transaction": "prepare", "x-transaction-timeout": 600_000}
    for start in range(0, count, window):
        ids = [f"{tag}-{i}" for i in range(start, min(start + window, count))]
        for txid in ids:
            p.publish("", queue, BODY, delivery_mode=2, message_id=txid, headers=headers)
        p.wait_confirms()
        for txid in ids:  # ... the local transactions commit here ...
            p.publish(CONTROL, "commit", b"", message_id=txid)
        p.wait_confirms()
    return count / (time.perf_counter() - t0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None, help="--store of the broker (default: journal)")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--windows", default="1,200", help="comma-separated confirm windows")
    args = ap.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    with TrioMQProcess(store=args.store, quiet=True) as broker:
        p = Producer(broker.url)
        print(f"store: {args.store or 'journal'}, {args.count} persistent messages of "
              f"{len(BODY)} bytes, one producer")
        print("| window | plain publish (msg/s) | half + commit (msg/s) | ratio |")
        print("|---:|---:|---:|---:|")
        for w in windows:
            qp, qh = f"bench.plain.{w}", f"bench.half.{w}"
            p.queue(qp)
            p.queue(qh)
            plain = run_plain(p, qp, args.count, w)
            half = run_half(p, qh, args.count, w, f"w{w}")
            print(f"| {w} | {plain:,.0f} | {half:,.0f} | {half / plain:.2f} |")


if __name__ == "__main__":
    main()
