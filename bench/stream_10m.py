"""A 10,000,000-message stream consumed from ``first`` over AMQP 0-9-1, on TrioMQ (started
here) and the machine's RabbitMQ (its stream plugin), same run.

    nice -n 5 .venv/bin/python -m bench.stream_10m [--messages 10000000] [--size 100]
        [--batch 100] [--skip-rabbitmq]

For each broker: the stream is filled fast through the Stream protocol (rstream's
``send_sub_entry``: batches of ``--batch`` messages, uncompressed), then read whole from
``first`` by one pika consumer (prefetch 1000, an ack with multiple=true every 500). Prints
the fill and consume rates, the broker's CPU per message consumed (utime + stime of its
process tree, from /proc) and its RSS as the consumer goes (it must not follow the
stream's length), then deletes the stream.
"""
from __future__ import annotations

import argparse
import asyncio
import shlex
import struct
import sys
import time
import uuid

from rstream import CompressionType

import rawamqp as ra

from .procinfo import TrioMQProcess, free_port, pid_listening_on, rss_kb
from .stream_protocol import RABBIT_STREAM, _cpu, _delete, _publish, _up

RABBIT_AMQP = 5672
DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver


def consume(amqp_port: int, stream: str, n: int, pid: int | None,
            marks: int = 10) -> tuple[float, list[tuple[int, float]]]:
    """Seconds to read ``n`` messages from first (raw 0-9-1 frames: pika's own cost per
    message would be the bottleneck), and (messages read, RSS MB) every n/marks."""
    c = ra.Connection(f"amqp://guest:guest@127.0.0.1:{amqp_port}/", timeout=120)
    c.channel_open(1)
    c.basic_qos(1, 2000)
    c.rpc(1, 60, 20, b"\x00\x00" + ra.shortstr(stream) + ra.shortstr("bench")
          + ra.bits(False, False, False, False) + ra.table({"x-stream-offset": "first"}),
          ra.BASIC_CONSUME_OK)
    sock = c.sock
    sock.settimeout(120)
    buf = bytearray(c.buf)
    step = max(1, n // marks)
    rss: list[tuple[int, float]] = []
    got = 0
    t0 = time.perf_counter()
    unpack = struct.unpack_from
    while got < n:
        pos, end = 0, len(buf)
        while end - pos >= 7:
            size = unpack(">I", buf, pos + 3)[0]
            if end - pos < size + 8:
                break
            if buf[pos] == 1 and buf[pos + 7:pos + 11] == DELIVER:
                got += 1
                if got % 500 == 0 or got == n:
                    tag = unpack(">Q", buf, pos + 12 + buf[pos + 11])[0]
                    sock.sendall(ra.ack_frame(1, tag, True))
                if got % step == 0 and pid is not None:
                    rss.append((got, round((rss_kb(pid) or 0) / 1024, 1)))
                    print(f"  {got:,} read, {got / (time.perf_counter() - t0):,.0f} msg/s, "
                          f"RSS {rss[-1][1]} MB", flush=True)
            pos += size + 8
        del buf[:pos]
        if got >= n:
            break
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError(f"{stream}: closed after {got} of {n}")
        buf += data
    elapsed = time.perf_counter() - t0
    sock.close()
    return elapsed, rss


def run(name: str, stream_port: int, amqp_port: int, pid: int | None, args) -> dict:
    stream = f"bench-10m-{uuid.uuid4().hex[:8]}"
    n = args.messages - args.messages % args.batch
    row: dict = {"broker": name, "messages": n}
    c0 = _cpu(pid)
    fill_s = asyncio.run(_publish(stream_port, stream, n, args.size, args.batch,
                                  CompressionType.No))
    c1 = _cpu(pid)
    row["fill_msg_per_s"] = round(n / fill_s)
    row["fill_cpu_us_per_msg"] = round((c1 - c0) / n * 1e6, 2)
    row["rss_mb_filled"] = round((rss_kb(pid) or 0) / 1024, 1) if pid else None
    print(name, "filled", row, flush=True)
    try:
        consume_s, rss = consume(amqp_port, stream, n, pid)
        c2 = _cpu(pid)
        row["consume_msg_per_s"] = round(n / consume_s)
        row["consume_s"] = round(consume_s, 1)
        row["consume_cpu_us_per_msg"] = round((c2 - c1) / n * 1e6, 2)
        row["rss_mb_while_consuming"] = rss
    finally:
        asyncio.run(_delete(stream_port, stream))
    print(name, row, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.stream_10m")
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--skip-rabbitmq", action="store_true")
    parser.add_argument("--only", choices=("triomq", "rabbitmq"))
    args = parser.parse_args(argv)
    print("$ " + shlex.join([sys.executable, "-m", "bench.stream_10m",
                             *(argv if argv is not None else sys.argv[1:])]), flush=True)
    rows = []
    if args.only != "rabbitmq":
        port = free_port()
        triomq = TrioMQProcess(extra_args=["--stream-port", str(port), "--http-port", "0"],
                               quiet=True)
        triomq.start()
        print("TrioMQ:", " ".join(triomq.cmd), flush=True)
        for _ in range(100):
            if _up(port):
                break
            time.sleep(0.1)
        try:
            rows.append(run("TrioMQ", port, triomq.port, triomq.pid, args))
        finally:
            triomq.stop()
    if args.only != "triomq" and not args.skip_rabbitmq and _up(RABBIT_STREAM):
        rows.append(run("RabbitMQ", RABBIT_STREAM, RABBIT_AMQP,
                        pid_listening_on(RABBIT_STREAM), args))
    if len(rows) == 2:
        t, r = rows
        print(f"ratios TrioMQ/RabbitMQ: consume {t['consume_msg_per_s'] / r['consume_msg_per_s']:.2f}"
              f", CPU/msg {t['consume_cpu_us_per_msg'] / r['consume_cpu_us_per_msg']:.2f}"
              f", fill {t['fill_msg_per_s'] / r['fill_msg_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
