"""How the Spark stream source reads (docs/streams.md, "Reading streams from Spark").

    python -m bench.stream_read [--messages 50000] [--size 100]

Publishes N messages (pika, one stream per broker) to a fresh TrioMQ and to the machine's
RabbitMQ 3.10 (Stream protocol on 5552, when it answers), then reads them all back, as
one Spark task reads a partition's range, with two clients: ``spark/streams/client.py``
(synchronous, the project's codec; records decoded with ``streams/record.py`` as the
source does) and rstream (asyncio, its AMQP decoder). For each: records/s, the client's
CPU per record (what an executor spends) and the broker's CPU per record (from /proc).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop-tests"))
from brokerproc import BrokerProc
from reference import rabbitmq_api

from spark.streams.client import StreamClient

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _beam_pid() -> int | None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() == "beam.smp":
                        return int(d)
            except OSError:
                continue
    return None


def _fill(amqp_port: int, stream_port: int, stream: str, n: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    ch = conn.channel()
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    body = b"x" * size
    for i in range(n):
        ch.basic_publish("", stream, body, pika.BasicProperties(message_id=str(i)))
    conn.close()
    with StreamClient("127.0.0.1", stream_port) as c:
        while c.end_offset(stream) < n:  # without confirms: until the log has them all
            time.sleep(0.2)


def _delete(amqp_port: int, stream: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    conn.channel().queue_delete(stream)
    conn.close()


def read_sync(port: int, stream: str, n: int) -> int:
    from broker.streams import record
    got = 0
    with StreamClient("127.0.0.1", port) as c:
        for r in c.records(stream, 0, n):
            record.decode(r.data)
            got += 1
    return got


def read_rstream(port: int, stream: str, n: int) -> int:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    async def go() -> int:
        got = 0
        done = asyncio.Event()

        async def on_message(msg, ctx):
            nonlocal got
            got += 1
            if got >= n:
                done.set()

        consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
        await consumer.start()
        try:
            await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                     offset_specification=ConsumerOffsetSpecification(
                                         OffsetType.FIRST, None))
            await asyncio.wait_for(done.wait(), 300)
        finally:
            await consumer.close()
        return got

    return asyncio.run(go())


def measure(name: str, broker_pid: int | None, fn, *args) -> dict:
    b0 = _cpu(broker_pid) if broker_pid else 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    n = fn(*args)
    wall, client = time.perf_counter() - t0, time.process_time() - c0
    broker = (_cpu(broker_pid) - b0) if broker_pid else float("nan")
    return {"name": name, "records": n, "per_s": n / wall,
            "client_us": client / n * 1e6, "broker_us": broker / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stream_read")
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=100)
    args = p.parse_args(argv)
    stream = f"bench-stream-read-{os.getpid()}"
    rows = []
    with tempfile.TemporaryDirectory() as d:
        b = BrokerProc(Path(d), stream=True).start()
        try:
            _fill(b.port, b.stream_port, stream, args.messages, args.size)
            pid = b.proc.pid
            rows.append(("TrioMQ", measure("sync client", pid, read_sync, b.stream_port,
                                           stream, args.messages)))
            rows.append(("TrioMQ", measure("rstream", pid, read_rstream, b.stream_port,
                                           stream, args.messages)))
        finally:
            b.stop()
    if rabbitmq_api() is not None:
        try:
            _fill(5672, 5552, stream, args.messages, args.size)
            pid = _beam_pid()
            rows.append(("RabbitMQ", measure("sync client", pid, read_sync, 5552, stream,
                                             args.messages)))
            rows.append(("RabbitMQ", measure("rstream", pid, read_rstream, 5552, stream,
                                             args.messages)))
        finally:
            _delete(5672, stream)
    print(f"{args.messages} records of {args.size} B, read from offset 0 to the end")
    print(f"{'broker':9} {'client':12} {'records/s':>10} {'client us/rec':>14} "
          f"{'broker us/rec':>14}")
    for broker, r in rows:
        print(f"{broker:9} {r['name']:12} {r['per_s']:10.0f} {r['client_us']:14.1f} "
              f"{r['broker_us']:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
