"""``spark/streams/client.py`` (the Spark source's synchronous Stream protocol client)
against a TrioMQ subprocess and the machine's RabbitMQ 3.10 (no StreamStats there: the
end of a stream comes from its last chunk)."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pika
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "interop-tests"))
from brokerproc import BrokerProc  # noqa: E402
from reference import rabbitmq_api  # noqa: E402

from broker.streams import record  # noqa: E402
from spark.streams.client import StreamClient  # noqa: E402


@pytest.fixture(scope="module")
def triomq():
    with tempfile.TemporaryDirectory() as d:
        b = BrokerProc(Path(d), stream=True).start()
        try:
            yield b
        finally:
            b.stop()


def _targets(triomq):
    yield "triomq", triomq.port, triomq.stream_port
    if rabbitmq_api() is not None:
        yield "rabbitmq", 5672, 5552


def _declare(amqp_port: int, name: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", name, f"m{i}".encode(),
                             pika.BasicProperties(headers={"i": i}))
    finally:
        conn.close()


def _delete(amqp_port: int, name: str) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        conn.channel().queue_delete(name)
    finally:
        conn.close()


def test_ranges_ends_and_timestamps(triomq):
    for target, amqp_port, stream_port in _targets(triomq):
        name = f"spark-client-{os.getpid()}-{target}"
        empty = name + "-empty"
        before = int(time.time() * 1000) - 60_000
        _declare(amqp_port, name, 12)
        _declare(amqp_port, empty, 0)
        try:
            with StreamClient("127.0.0.1", stream_port) as c:
                assert c.end_offset(name) == 12, target
                assert c.first_offset(name) == 0, target
                assert c.end_offset(empty) == 0, target
                got = list(c.records(name, 4, 9))
                assert [r.offset for r in got] == [4, 5, 6, 7, 8], target
                bodies = [record.decode(r.data)[4] for r in got]
                assert bodies == [f"m{i}".encode() for i in range(4, 9)], target
                assert c.offset_at(name, before) == 0, target
                assert c.offset_at(name, int(time.time() * 1000) + 3_600_000) == 12, target
                assert 0 <= c.committed_chunk(name) <= 11, target
        finally:
            _delete(amqp_port, name)
            _delete(amqp_port, empty)


def test_decode_chunk_opens_subentries_within_a_bound():
    from broker.streamproto import codec
    from spark.streams import client
    plain = [b"one", b"two"]
    batch = codec.make_subentry([b"x" * 1000, b"y"], codec.COMPRESSION_GZIP)
    chunk = codec.encode_chunk(7, 1234, [codec.simple_entry(m) for m in plain]
                               + [codec.subentry_entry(batch)], 4)
    header, messages = client.decode_chunk(memoryview(chunk))
    assert (header["first_offset"], header["timestamp"]) == (7, 1234)
    assert messages == [b"one", b"two", b"x" * 1000, b"y"]
    # a batch that opens to more than the bound (the codec's own decoder, for tests,
    # would open it) is refused before it is opened
    huge = codec.make_subentry([bytes(client.MAX_SUBENTRY_BYTES)], codec.COMPRESSION_GZIP)
    bad = codec.encode_chunk(0, 0, [codec.subentry_entry(huge)], 1)
    with pytest.raises(codec.FrameError, match="sub-entry batch of"):
        client.decode_chunk(memoryview(bad))
    damaged = bytearray(chunk)
    damaged[-1] ^= 1
    with pytest.raises(codec.FrameError):
        client.decode_chunk(memoryview(bytes(damaged)))
