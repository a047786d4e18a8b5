"""Memory of the journal store under a backlog: a publish burst faster than the disk, and
deliveries a consumer never acks.

    .venv/bin/python -m bench.journal_memory [--burst-mib 512] [--size 65536]
                                             [--unacked 20000] [--unacked-size 4096]

1. burst: persistent messages (no confirms) from 4 connections as fast as the sockets
   take them into a durable queue with no consumer; the broker's peak RSS is sampled
   every 10 ms. The journal's unwritten buffer is bounded (``max_unwritten``: publishers
   are blocked by a resource alarm above it), so the peak stays near the baseline plus
   the queue's memory budget and the bound, whatever the burst;
2. unacked: ``--unacked`` persistent messages into a durable queue, delivered to a
   consumer with no prefetch limit that never acks; RSS growth per message and as a
   multiple of the payload, beside the same backlog left in the queue (paged).
"""
from __future__ import annotations

import argparse
import struct
import threading
import time

import rawamqp as ra

from .procinfo import TrioMQProcess, rss_kb

_FH = struct.Struct(">BHI")


def _declare(url: str, queue: str) -> None:
    c = ra.Connection(url, timeout=60)
    c.channel_open(1)
    c.queue_declare(1, queue, durable=True)
    c.close()


def _blast(url: str, queue: str, n: int, size: int) -> None:
    """n persistent publishes, no confirms; returns once the broker has read them all."""
    c = ra.Connection(url, timeout=600)
    c.channel_open(1)
    frame = ra.encode_publish(1, "", queue, b"x" * size, 131072, delivery_mode=2)[0]
    sent = 0
    while sent < n:
        k = min(n - sent, 64)
        c.sock.sendall(frame * k)
        sent += k
    c.queue_declare(1, queue, durable=True)  # a round trip: everything before it was read
    c.close(timeout=600)


class Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            kb = rss_kb(self.pid) or 0
            self.peak = max(self.peak, kb)
            time.sleep(0.01)


def burst(args) -> None:
    with TrioMQProcess(quiet=True) as b:
        _declare(b.url, "burst")
        time.sleep(0.5)
        base = rss_kb(b.pid) or 0
        s = Sampler(b.pid)
        s.start()
        n = args.burst_mib * 1024 * 1024 // args.size
        per = n // 4
        t0 = time.monotonic()
        threads = [threading.Thread(target=_blast, args=(b.url, "burst", per, args.size))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.monotonic() - t0
        time.sleep(0.5)
        s.stop_event.set()
        s.join()
        end = rss_kb(b.pid) or 0
        print(f"burst: {4 * per} x {args.size} B ({4 * per * args.size >> 20} MiB) in {dt:.1f} s "
              f"({4 * per * args.size / dt / 2**20:.0f} MiB/s); RSS {base >> 10} MiB before, "
              f"peak {s.peak >> 10} MiB (+{(s.peak - base) >> 10} MiB), {end >> 10} MiB after")


def _consume_never_ack(url: str, queue: str, n: int, ready: threading.Event) -> None:
    c = ra.Connection(url, timeout=600)
    c.channel_open(1)
    c.basic_consume(1, queue)
    sock = c.sock
    buf = bytearray(c.buf)
    got = 0
    while got < n:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _ch, sz = _FH.unpack_from(buf, pos)
            if len(buf) - pos < 8 + sz:
                break
            if ftype == ra.FRAME_METHOD and buf[pos + 7:pos + 11] == b"\x00\x3c\x00\x3c":
                got += 1
            pos += 8 + sz
        del buf[:pos]
    ready.set()
    time.sleep(3600)  # holds its deliveries until the process ends


def unacked(args) -> None:
    n, size = args.unacked, args.unacked_size
    payload = n * size
    for mode in ("paged backlog", "unacked"):
        with TrioMQProcess(quiet=True) as b:
            _declare(b.url, "u")
            time.sleep(0.5)
            base = rss_kb(b.pid) or 0
            base_anon = rss_kb(b.pid, "RssAnon") or 0
            if mode == "unacked":
                done = threading.Event()
                threading.Thread(target=_consume_never_ack, args=(b.url, "u", n, done),
                                 daemon=True).start()
            _blast(b.url, "u", n, size)
            if mode == "unacked":
                done.wait(600)
            time.sleep(4.0)  # the journal pages unacked deliveries out after 1-2 s
            grown = ((rss_kb(b.pid) or 0) - base) * 1024
            # RssAnon: the heap; the rest is journal segments mapped and read (page cache)
            anon = ((rss_kb(b.pid, "RssAnon") or 0) - base_anon) * 1024
            print(f"{mode}: {n} x {size} B: RSS +{grown >> 20} MiB, {grown / n:.0f} B per "
                  f"message, {grown / payload:.2f}x the payload; anonymous {anon / n:.0f} B "
                  f"per message")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--burst-mib", type=int, default=512)
    p.add_argument("--size", type=int, default=65536)
    p.add_argument("--unacked", type=int, default=20000)
    p.add_argument("--unacked-size", type=int, default=4096)
    p.add_argument("--only", choices=("burst", "unacked"))
    args = p.parse_args(argv)
    if args.only != "unacked":
        burst(args)
    if args.only != "burst":
        unacked(args)


if __name__ == "__main__":
    main()
