"""Backlog / restart benchmark for TrioMQ's persistent store.

    .venv/bin/python -m bench.backlog [--messages 1000000] [--size 64] [--store URL]
                                      [--priorities 10]

1. start TrioMQ (own data dir), measure the consume rate of persistent messages
   flowing through an empty durable queue (publisher with confirms + consumer
   with manual acks, concurrently): the "empty-queue rate";
2. publish --messages persistent messages with confirms to a durable queue with
   no consumer; report broker RSS growth; with --priorities N the queue has
   x-max-priority N-1 and message i has priority i % N;
3. kill it (SIGKILL) and start it again: time until it completes an AMQP
   handshake, and the queue's message count; the same after SIGTERM;
4. drain the backlog with the same consumer; report the rate and its ratio to
   the empty-queue rate (with --priorities: and how many deliveries came after
   one of a lower priority, which strict priority order makes 0).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time

import rawamqp as ra

from .procinfo import TrioMQProcess, rss_kb

_FH = struct.Struct(">BHI")
_CM = struct.Struct(">HH")


def _publish_frames(queue: str, body: bytes, priorities: int) -> list[bytes]:
    """One basic.publish (+ header + body) per priority 0..priorities-1 (or one without)."""
    if not priorities:
        return [ra.encode_publish(1, "", queue, body, 131072, delivery_mode=2)[0]]
    m = ra.method_frame(1, ra.BASIC_PUBLISH, b"\x00\x00" + ra.shortstr("") + ra.shortstr(queue)
                        + b"\x00")
    return [b"".join([m, ra.content_header(1, len(body), props=ra.basic_properties(
        delivery_mode=2, priority=p)), *ra.body_frames(1, body, 131072)])
        for p in range(priorities)]


def publish(url: str, queue: str, n: int, size: int, window: int = 2000,
            priorities: int = 0) -> float:
    """Publish n persistent messages with confirms; message i has priority i % priorities."""
    c = ra.Connection(url, timeout=60)
    c.channel_open(1)
    c.confirm_select(1)
    frames = _publish_frames(queue, b"x" * size, priorities)
    sock = c.sock
    sent = acked = 0
    buf = bytearray(c.buf)
    t0 = time.monotonic()
    while acked < n:
        if sent < n and sent - acked < window:
            k = min(n - sent, window - (sent - acked), 500)
            if len(frames) == 1:
                sock.sendall(frames[0] * k)
            else:
                sock.sendall(b"".join([frames[(sent + j) % len(frames)] for j in range(k)]))
            sent += k
            continue
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _ch, sz = _FH.unpack_from(buf, pos)
            if len(buf) - pos < 8 + sz:
                break
            if ftype == ra.FRAME_METHOD:
                cls, meth = _CM.unpack_from(buf, pos + 7)
                if (cls, meth) == (60, 80):
                    tag, multiple = struct.unpack_from(">QB", buf, pos + 11)
                    acked = tag if multiple & 1 else max(acked, tag)
                elif (cls, meth) == (60, 120):
                    raise RuntimeError("broker nacked a publish")
                elif (cls, meth) in ((10, 50), (20, 40)):
                    raise RuntimeError("broker closed the channel/connection")
            pos += 8 + sz
        del buf[:pos]
    dt = time.monotonic() - t0
    c.close()
    return n / dt


def _header_priority(buf, pos: int) -> int:
    """The priority property of the content header frame at ``pos`` (0 if absent)."""
    flags = struct.unpack_from(">H", buf, pos + 7 + 12)[0]
    p = pos + 7 + 14
    for bit in (0x8000, 0x4000):  # content-type, content-encoding
        if flags & bit:
            p += 1 + buf[p]
    if flags & 0x2000:  # headers
        p += 4 + struct.unpack_from(">I", buf, p)[0]
    if flags & 0x1000:  # delivery-mode
        p += 1
    return buf[p] if flags & 0x0800 else 0


def consume(url: str, queue: str, n: int, prefetch: int = 2000, timeout: float = 600,
            order: dict | None = None) -> float:
    """Consume n messages with manual acks (multiple); returns msg/s from the first delivery.
    With ``order`` (a dict), counts in ``order["inversions"]`` the deliveries whose priority
    is higher than the one before (a priority queue drained in strict order has none)."""
    last_prio = 1 << 16
    inversions = 0
    c = ra.Connection(url, timeout=60)
    c.channel_open(1)
    c.basic_qos(1, prefetch)
    c.basic_consume(1, queue)
    sock = c.sock
    buf = bytearray(c.buf)
    got = 0
    last_tag = 0
    acked_tag = 0
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    first = True
    while got < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumed only {got} of {n}")
        if not first:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("broker closed the connection")
            buf += data
        first = False
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _ch, sz = _FH.unpack_from(buf, pos)
            if len(buf) - pos < 8 + sz:
                break
            if ftype == ra.FRAME_METHOD:
                cls, meth = _CM.unpack_from(buf, pos + 7)
                if (cls, meth) == (60, 60):
                    p = pos + 11
                    p += 1 + buf[p]  # consumer tag
                    (last_tag,) = struct.unpack_from(">Q", buf, p)
                    got += 1
            elif ftype == 2 and order is not None:
                prio = _header_priority(buf, pos)
                inversions += prio > last_prio
                last_prio = prio
            pos += 8 + sz
        del buf[:pos]
        if last_tag - acked_tag >= prefetch // 4 or got >= n:
            sock.sendall(ra.ack_frame(1, last_tag, True))
            acked_tag = last_tag
    dt = time.monotonic() - t0
    c.close()
    if order is not None:
        order["inversions"] = inversions
    return n / dt


def queue_count(url: str, queue: str, arguments: dict | None = None) -> int:
    c = ra.Connection(url, timeout=60)
    c.channel_open(1)
    _name, count, _consumers = c.queue_declare(1, queue, durable=True, arguments=arguments)
    c.close()
    return count


def start(data_dir: str, store: str | None, timeout: float = 120.0) -> tuple[TrioMQProcess, float]:
    p = TrioMQProcess(store=store, data_dir=data_dir, startup_timeout=timeout)
    t0 = time.monotonic()
    p.start()
    return p, time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--empty-messages", type=int, default=200_000,
                    help="messages for the empty-queue rate (default 200000)")
    ap.add_argument("--store", default=None, help="--store passed to the broker (default journal)")
    ap.add_argument("--data-dir", default=None, help="data dir (default: a temp dir, removed after)")
    ap.add_argument("--priorities", type=int, default=0, metavar="N",
                    help="backlog queue with x-max-priority N-1, message i at priority i %% N "
                         "(default 0: a plain FIFO queue)")
    args = ap.parse_args(argv)
    print("Command: `" + " ".join([os.path.basename(sys.executable), "-m", "bench.backlog"]
                                  + (argv if argv is not None else sys.argv[1:])) + "`", flush=True)
    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="triomq-backlog-")
        data_dir = tmp
    results = {}
    procs = []
    try:
        p, t = start(data_dir, args.store)
        procs.append(p)
        c = ra.Connection(p.url)
        c.channel_open(1)
        c.queue_declare(1, "bench.empty", durable=True)
        backlog_args = {"x-max-priority": args.priorities - 1} if args.priorities else None
        c.queue_declare(1, "bench.backlog", durable=True, arguments=backlog_args)
        c.close()
        # 1. empty-queue rate
        rate = {}
        th = threading.Thread(target=lambda: rate.__setitem__(
            "c", consume(p.url, "bench.empty", args.empty_messages)))
        th.start()
        time.sleep(0.3)
        rate["p"] = publish(p.url, "bench.empty", args.empty_messages, args.size)
        th.join()
        results["empty_rate"] = rate["c"]
        print(f"empty-queue rate (persistent, confirms, manual ack): {rate['c']:,.0f} msg/s "
              f"(publish {rate['p']:,.0f} msg/s)", flush=True)
        # 2. backlog
        rss0 = rss_kb(p.pid) or 0
        pub = publish(p.url, "bench.backlog", args.messages, args.size,
                      priorities=args.priorities)
        time.sleep(1.0)
        rss1 = rss_kb(p.pid) or 0
        hwm = rss_kb(p.pid, "VmHWM") or 0
        results["backlog_publish_rate"] = pub
        results["rss_growth_mb"] = (rss1 - rss0) / 1024
        print(f"backlog: published {args.messages:,} x {args.size} B persistent with confirms at "
              f"{pub:,.0f} msg/s; broker RSS {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MB "
              f"(growth {(rss1 - rss0) / 1024:.0f} MB, peak {hwm / 1024:.0f} MB)", flush=True)
        n = queue_count(p.url, "bench.backlog", backlog_args)
        print(f"queue count before restart: {n:,}", flush=True)
        # 3. restarts
        for how in ("SIGKILL", "SIGTERM"):  # kill -9 first: replay since the last periodic checkpoint
            if how == "SIGTERM":
                t_stop = time.monotonic()
                os.killpg(p.proc.pid, signal.SIGTERM)
                p.proc.wait(60)
                stop_s = time.monotonic() - t_stop
            else:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait(60)
                stop_s = 0.0
            p.stop()
            p, t = start(data_dir, args.store)
            procs.append(p)
            n2 = queue_count(p.url, "bench.backlog", backlog_args)
            results[f"restart_{how}_s"] = t
            print(f"restart after {how}: stop took {stop_s:.1f}s; listening again (AMQP handshake) "
                  f"after {t:.2f}s; queue count {n2:,} ({'intact' if n2 == n else 'CHANGED'}); "
                  f"RSS {(rss_kb(p.pid) or 0) / 1024:.0f} MB", flush=True)
        # 4. drain
        order: dict | None = {} if args.priorities else None
        drain = consume(p.url, "bench.backlog", n, order=order)
        results["drain_rate"] = drain
        print(f"drain: {n:,} messages at {drain:,.0f} msg/s = "
              f"{drain / results['empty_rate']:.2f} x the empty-queue rate", flush=True)
        if order is not None:
            print(f"priority order: {order['inversions']} deliveries after a lower priority "
                  f"(0 = strict order kept across both restarts)", flush=True)
        print(f"broker RSS after drain: {(rss_kb(p.pid) or 0) / 1024:.0f} MB", flush=True)
    finally:
        for p in procs:
            p.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
