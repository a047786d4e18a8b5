"""Stream protocol benchmark: rstream against TrioMQ (started here) and the machine's
RabbitMQ (5552), same client and load, one run.

    .venv/bin/python -m bench.stream_protocol [--messages 200000] [--size 100]
                                              [--batch 100] [--compression none|gzip]
                                              [--repeats 3] [--skip-rabbitmq]

Each round, for each broker: a fresh stream; **publish**: ``--messages`` messages of
``--size`` bytes in sub-entry batches of ``--batch`` (rstream's ``send_sub_entry``,
compressed with ``--compression``), timed from the first send to the last confirm;
**consume**: one subscription from the first offset (credit 10 chunks, rstream's
default), timed until every message arrived. Printed per phase: messages per second,
the broker's CPU seconds in the window (utime+stime of its processes from /proc) per
message, and the TrioMQ/RabbitMQ ratios. The client is one Python process (asyncio), so
the rates are the client's as much as the brokers'; the CPU per message is the broker's
own. Extra TrioMQ arguments: ``--broker-arg X`` (repeatable).
"""
from __future__ import annotations

import argparse
import asyncio
import shlex
import socket
import statistics
import sys
import time
import uuid

from rstream import (
    AMQPMessage,
    CompressionType,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
)

from .procinfo import TrioMQProcess, cpu_seconds, free_port, pid_listening_on, process_tree

RABBIT_STREAM = 5552


def _cpu(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    return sum(cpu_seconds(p) or 0.0 for p in process_tree(pid))


async def _publish(port: int, stream: str, n: int, size: int, batch: int,
                   compression: CompressionType) -> float:
    confirmed = 0
    done = asyncio.Event()

    def on_confirm(status) -> None:
        nonlocal confirmed
        if status.is_confirmed:
            confirmed += 1
            if confirmed * batch >= n:
                done.set()

    body = b"x" * size
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.create_stream(stream)
        messages = [AMQPMessage(body=body) for _ in range(batch)]
        start = time.perf_counter()
        for _ in range(n // batch):
            await p.send_sub_entry(stream, messages, compression_type=compression,
                                   on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 600)
        return time.perf_counter() - start


async def _consume(port: int, stream: str, n: int) -> float:
    received = 0
    done = asyncio.Event()

    def on_message(msg, ctx) -> None:
        nonlocal received
        received += 1
        if received >= n:
            done.set()

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    try:
        start = time.perf_counter()
        await consumer.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(
            OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - start
    finally:
        await consumer.close()
    return elapsed


async def _delete(port: int, stream: str) -> None:
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.delete_stream(stream, missing_ok=True)


def measure(port: int, pid: int | None, n: int, size: int, batch: int,
            compression: CompressionType) -> dict:
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    cpu0 = _cpu(pid)
    pub_s = asyncio.run(_publish(port, stream, n, size, batch, compression))
    cpu1 = _cpu(pid)
    con_s = asyncio.run(_consume(port, stream, n))
    cpu2 = _cpu(pid)
    asyncio.run(_delete(port, stream))
    return {"publish_msg_per_s": round(n / pub_s), "consume_msg_per_s": round(n / con_s),
            "publish_cpu_us_per_msg": round((cpu1 - cpu0) / n * 1e6, 2),
            "consume_cpu_us_per_msg": round((cpu2 - cpu1) / n * 1e6, 2)}


def _up(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.stream_protocol")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-rabbitmq", action="store_true")
    parser.add_argument("--broker-arg", action="append", default=[])
    args = parser.parse_args(argv)
    print("$ " + shlex.join([sys.executable, "-m", "bench.stream_protocol",
                             *(argv if argv is not None else sys.argv[1:])]))
    compression = CompressionType.Gzip if args.compression == "gzip" else CompressionType.No
    n = args.messages - args.messages % args.batch
    port = free_port()
    triomq = TrioMQProcess(extra_args=["--stream-port", str(port), "--http-port", "0",
                                       *args.broker_arg], quiet=True)
    triomq.start()
    print("TrioMQ:", " ".join(triomq.cmd))
    for _ in range(100):
        if _up(port):
            break
        time.sleep(0.1)
    rabbit = not args.skip_rabbitmq and _up(RABBIT_STREAM)
    rabbit_pid = pid_listening_on(RABBIT_STREAM) if rabbit else None
    rows = []
    try:
        for i in range(args.repeats):
            t = measure(port, triomq.pid, n, args.size, args.batch, compression)
            print(f"round {i + 1} TrioMQ", t, flush=True)
            r = None
            if rabbit:
                r = measure(RABBIT_STREAM, rabbit_pid, n, args.size, args.batch, compression)
                print(f"round {i + 1} RabbitMQ", r, flush=True)
                print(f"round {i + 1} ratios TrioMQ/RabbitMQ: publish "
                      f"{t['publish_msg_per_s'] / r['publish_msg_per_s']:.2f}, consume "
                      f"{t['consume_msg_per_s'] / r['consume_msg_per_s']:.2f}", flush=True)
            rows.append((t, r))
    finally:
        triomq.stop()
    for key in ("publish_msg_per_s", "consume_msg_per_s", "publish_cpu_us_per_msg",
                "consume_cpu_us_per_msg"):
        line = f"median {key}: TrioMQ {statistics.median(t[key] for t, _ in rows)}"
        if rabbit:
            line += f", RabbitMQ {statistics.median(r[key] for _, r in rows if r)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
