"""Stream messages in the audit trail: each publish's offset, every consumer's deliveries by
offset (Stream-protocol chunks to rstream and rbfly, AMQP 0-9-1 deliveries to pika), and
what retention removed -- a real broker process, the Avro files read back."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pika
import pytest
import rbfly.streams as rbs
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    Properties,
    amqp_decoder,
)

from broker.audit.reader import FileReader
from broker.audit.writer import node_files

from .test_stream_trail import _port, _wait_port

ROOT = __file__.rsplit("/tests/", 1)[0]
WAIT = 30


async def _read(port: int, stream: str, n: int) -> list:
    got: list = []
    done = asyncio.Event()

    async def on_message(msg, ctx) -> None:
        got.append(ctx.offset)
        if len(got) >= n:
            done.set()

    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), WAIT)
    finally:
        await consumer.close()
    return got


async def _stream_traffic(port: int) -> None:
    """5 single publishes into ``st`` and a sub-entry batch of 3 into ``sb`` (rstream), read
    from the first offset by rstream subscriptions, and ``st`` by rbfly too."""
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.create_stream("st")
        await p.create_stream("sb")
        for i in range(5):
            await p.send_wait("st", AMQPMessage(body=b"m%d" % i,
                                                properties=Properties(message_id=f"m-{i}")))
        confirmed: list = []
        await p.send_sub_entry("sb", [AMQPMessage(body=b"b%d" % i) for i in range(3)],
                               on_publish_confirm=confirmed.append)
        for _ in range(600):
            if confirmed:
                break
            await asyncio.sleep(0.05)
        assert confirmed and all(c.is_confirmed for c in confirmed)
    assert await _read(port, "sb", 3) == [0, 1, 2]


async def _reads(port: int) -> None:
    """``st`` (7 records by now) read whole by an rstream and an rbfly subscription; ``sb``
    deleted."""
    assert await _read(port, "st", 7) == list(range(7))
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/")
    try:
        read = []
        async for msg in client.subscribe("st", offset=rbs.Offset.FIRST, timeout=WAIT):
            read.append(msg)
            if len(read) == 7:
                break
        assert len(read) == 7
    finally:
        await client.disconnect()
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.delete_stream("sb")  # its records leave with it


def _amqp_traffic(port: int) -> None:
    """2 publishes into ``st`` over AMQP 0-9-1 (after the rstream ones: 7 in all), a pika
    stream consumer from the first offset; ``short``: a stream whose retention removes its
    oldest segments."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(2):
        ch.basic_publish("", "st", b"a%d" % i, pika.BasicProperties(message_id=f"a-{i}"))
    ch.queue_declare("short", durable=True, arguments={
        "x-queue-type": "stream", "x-max-length-bytes": 6000,
        "x-stream-max-segment-size-bytes": 2000})
    for i in range(60):
        ch.basic_publish("", "short", b"%03d" % i + b"x" * 200)
    ch.basic_qos(prefetch_count=100)
    offsets: list = []
    ch.basic_consume("st", lambda c, m, p, b: (offsets.append(p.headers["x-stream-offset"]),
                                               c.basic_ack(m.delivery_tag)),
                     consumer_tag="pika-reader", arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + WAIT
    while len(offsets) < 7 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert offsets == list(range(7))
    conn.close()


def run_traffic(tmp_path) -> str:
    """Run a broker with the trail on, the stream traffic, a clean stop; the trail's dir."""
    port, stream_port = _port(), _port()
    log = open(tmp_path / "broker.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(port),
         "--stream-port", str(stream_port), "--http-port", "0", "--mqtt-port", "0",
         "--data-dir", str(tmp_path / "data"), "--audit-dir", str(tmp_path / "trail"),
         "--audit-node", "mq"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_port(proc, stream_port)
        _wait_port(proc, port)
        asyncio.run(_stream_traffic(stream_port))
        _amqp_traffic(port)
        asyncio.run(_reads(stream_port))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
    return str(tmp_path / "trail")


@pytest.mark.timeout(180)
def test_stream_publishes_and_deliveries_by_offset(tmp_path):
    trail = run_traffic(tmp_path)
    records = sorted((r for f in node_files(trail, "mq") for r in FileReader(f)),
                     key=lambda r: r["seq"])
    located = {r["msg"]: (r["queue"], r["stream_offset"]) for r in records
               if r["event"] == "appended"}
    pubs = {r["msg"]: r for r in records
            if r["event"] == "published" and r["queues"] in (["st"], ["sb"])}
    # every publish into a stream is located: msg -> (stream, offset), in publishing order
    assert len(pubs) == 10 and set(pubs) <= set(located)
    assert sorted(located[m] for m in pubs) == [("sb", o) for o in range(3)] + \
        [("st", o) for o in range(7)]
    by_offset = {located[msg]: r for msg, r in pubs.items()}
    assert [by_offset["st", o]["message_id"] for o in (0, 4, 5, 6)] == \
        ["m-0", "m-4", "a-0", "a-1"]
    assert len({by_offset["sb", o]["confirm_seq"] for o in range(3)}) == 1  # one batch
    # deliveries name offset ranges (a chunk to a Stream-protocol subscription, one record
    # to an AMQP 0-9-1 consumer): every consumer of st read all of it, sb's one all of sb
    reads: dict = {}
    for r in records:
        if r["event"] == "delivered":
            assert r["msg"] is None and r["stream_count"] >= 1
            key = (r["queue"], r["connection"], r["consumer_tag"])
            reads.setdefault(key, set()).update(
                range(r["stream_offset"], r["stream_offset"] + r["stream_count"]))
    assert sorted((k[0], sorted(v)) for k, v in reads.items()) == \
        [("sb", [0, 1, 2])] + [("st", list(range(7)))] * 3
    amqp = [r for r in records if r["consumer_tag"] == "pika-reader"]
    assert [(r["event"], r["stream_offset"]) for r in amqp if r["event"] == "delivered"] == \
        [("delivered", o) for o in range(7)]
    assert sorted(r["stream_offset"] for r in amqp if r["event"] == "acked") == list(range(7))
    gone = [(r["stream_offset"], r["stream_count"], r["reason"]) for r in records
            if r["event"] == "truncated" and r["queue"] == "sb"]
    assert gone == [(0, 3, "deleted")]
    # retention: the removed records' range, below every record still in the stream
    short = [r for r in records if r["queue"] == "short"]
    cut = [r for r in short if r["event"] == "truncated"]
    assert cut and all(r["reason"] == "retention" for r in cut)
    assert cut[0]["stream_offset"] == 0
    ends = [r["stream_offset"] + r["stream_count"] for r in cut]
    assert ends == sorted(ends) and 0 < ends[-1] < 60
    assert len([r for r in short if r["event"] == "appended"]) == 60
