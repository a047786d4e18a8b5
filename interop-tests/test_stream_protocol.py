"""The RabbitMQ Stream protocol with real clients -- rstream and rbfly (asyncio) -- against
TrioMQ's listener (a subprocess on free ports) and against the machine's RabbitMQ 3.10
stream plugin on 5552 (skipped when it does not answer), and across protocols with pika
(a stream queue declared, published and consumed over AMQP 0-9-1)."""
from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid

import mmh3
import pika
import pytest
import rbfly.streams as rbs
from brokerproc import BrokerProc, free_port
from reference import rabbitmq_api
from rstream import (
    AMQPMessage,
    CompressionType,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
    schema,
)
from rstream.exceptions import StreamAlreadyExists

from broker.streamproto import codec as c

pytestmark = pytest.mark.timeout(120)

RABBIT_STREAM = 5552
WAIT = 20.0  # seconds a condition may take on a loaded machine


class Target:
    def __init__(self, name: str, port: int, amqp_url: str, proc: BrokerProc | None = None):
        self.name = name
        self.port = port
        self.amqp_url = amqp_url
        self.proc = proc

    def producer(self, **kw) -> Producer:
        return Producer("127.0.0.1", port=self.port, username="guest", password="guest", **kw)

    def consumer(self, **kw) -> Consumer:
        return Consumer("127.0.0.1", port=self.port, username="guest", password="guest", **kw)

    def rbfly(self) -> rbs.StreamsClient:
        return rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{self.port}/")


def _rabbit_stream_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", RABBIT_STREAM), timeout=2).close()
    except OSError:
        return False
    api = rabbitmq_api()
    if api is None:
        return False
    api.close()
    return True


@pytest.fixture(scope="module")
def triomq(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("streamproto") / "data", stream=True)
    proc.start()
    try:
        yield Target("triomq", proc.stream_port, proc.url, proc)
    finally:
        proc.stop()


@pytest.fixture(params=["triomq", "rabbitmq"])
def target(request):
    if request.param == "rabbitmq":
        if not _rabbit_stream_up():
            pytest.skip("RabbitMQ's stream plugin is not reachable on 127.0.0.1:5552")
        return Target("rabbitmq", RABBIT_STREAM, "amqp://guest:guest@127.0.0.1:5672/%2F")
    return request.getfixturevalue("triomq")


def _name(prefix: str = "sp") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


async def _consume(target: Target, stream: str, n: int, spec=None, **kw) -> list:
    """(offset, body) of the first ``n`` messages from ``spec`` (first by default)."""
    got: list = []
    done = asyncio.Event()

    async def on_message(msg, ctx: MessageContext):
        got.append((ctx.offset, msg))
        if len(got) >= n:
            done.set()

    consumer = target.consumer()
    await consumer.start()
    try:
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=spec or ConsumerOffsetSpecification(
                                     OffsetType.FIRST, None), **kw)
        await asyncio.wait_for(done.wait(), WAIT)
    finally:
        await consumer.close()
    return [(off, bytes(m.body)) for off, m in got[:n]]


async def _delete(target: Target, stream: str) -> None:
    async with target.producer() as p:
        await p.delete_stream(stream, missing_ok=True)


def test_publish_and_consume_from_each_offset(target):
    stream = _name()

    async def go():
        async with target.producer() as p:
            await p.create_stream(stream)
            with pytest.raises(StreamAlreadyExists):
                await p.create_stream(stream)
            for i in range(5):
                await p.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))
        first = await _consume(target, stream, 5)
        assert first == [(i, f"m{i}".encode()) for i in range(5)]
        from_offset = await _consume(target, stream, 2, ConsumerOffsetSpecification(
            OffsetType.OFFSET, 3))
        assert from_offset == [(3, b"m3"), (4, b"m4")]
        # "next": only what is published after the subscription
        got: list = []
        done = asyncio.Event()

        async def on_message(msg, ctx):
            got.append((ctx.offset, bytes(msg.body)))
            done.set()

        consumer = target.consumer()
        await consumer.start()
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.NEXT, None))
        async with target.producer() as p:
            await p.send_wait(stream, AMQPMessage(body=b"later"))
        await asyncio.wait_for(done.wait(), WAIT)
        await consumer.close()
        assert got == [(5, b"later")]
        # a timestamp before everything: from the first chunk
        ts = await _consume(target, stream, 6, ConsumerOffsetSpecification(
            OffsetType.TIMESTAMP, int(time.time() * 1000) - 3_600_000))
        assert [o for o, _ in ts] == list(range(6))
        await _delete(target, stream)

    run(go())


@pytest.mark.parametrize("compression", [CompressionType.No, CompressionType.Gzip])
def test_sub_entry_batches(target, compression):
    stream = _name("sub")

    async def go():
        confirmed: list = []
        async with target.producer() as p:
            await p.create_stream(stream)
            await p.send_sub_entry(stream, [AMQPMessage(body=b"a%d" % i) for i in range(50)],
                                   compression_type=compression,
                                   on_publish_confirm=lambda s: confirmed.append(s))
            # rstream sends sub-entries from a timer: wait for the confirm, then the next
            for _ in range(int(WAIT / 0.05)):
                if confirmed:
                    break
                await asyncio.sleep(0.05)
            await p.send_wait(stream, AMQPMessage(body=b"after"))
        got = await _consume(target, stream, 51)
        assert [b for _, b in got] == [b"a%d" % i for i in range(50)] + [b"after"]
        assert [o for o, _ in got] == list(range(51))
        assert confirmed and all(s.is_confirmed for s in confirmed)
        await _delete(target, stream)

    run(go())


def test_deduplication_and_publisher_sequence(target):
    stream = _name("dedup")

    async def go():
        async with target.producer() as p:
            await p.create_stream(stream)
            client = await p.default_client
            await client.declare_publisher(stream=stream, reference="ref-1", publisher_id=7)
            assert await client.query_publisher_sequence(stream, "ref-1") == 0
            confirms: list = []
            done = asyncio.Event()

            def on_confirm(frame):
                confirms.extend(frame.publishing_ids)
                if len(confirms) >= 6:
                    done.set()

            client.add_handler(schema.PublishConfirm, on_confirm, name="t")
            msgs = [schema.Message(pid, None, bytes(AMQPMessage(body=b"d%d" % pid)))
                    for pid in (1, 2, 3)]
            await client.publish(msgs, publisher_id=7)
            # 2 and 3 again, and 4: only 4 is written; every id is confirmed
            msgs = [schema.Message(pid, None, bytes(AMQPMessage(body=b"d%d" % pid)))
                    for pid in (2, 3, 4)]
            await client.publish(msgs, publisher_id=7)
            await asyncio.wait_for(done.wait(), WAIT)
            assert sorted(confirms) == [1, 2, 2, 3, 3, 4]
            assert await client.query_publisher_sequence(stream, "ref-1") == 4
            assert await client.query_publisher_sequence(stream, "other") == 0
            await client.delete_publisher(7)
        got = await _consume(target, stream, 4)
        assert [b for _, b in got] == [b"d1", b"d2", b"d3", b"d4"]
        await _delete(target, stream)

    run(go())


def test_store_and_query_offset(target):
    stream = _name("off")

    async def go():
        async with target.consumer() as consumer:
            await consumer.create_stream(stream)
            client = await consumer.default_client
            with pytest.raises(Exception):  # noqa: B017 - rstream's OffsetNotFound
                await consumer.query_offset(stream, "app-1")
            await consumer.store_offset(stream, "app-1", 41)
            await consumer.store_offset(stream, "app-1", 42)
            for _ in range(200):  # StoreOffset has no answer: ask until it is seen
                try:
                    if await consumer.query_offset(stream, "app-1") == 42:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.05)
            assert await consumer.query_offset(stream, "app-1") == 42
            assert client is not None
            await consumer.delete_stream(stream)

    run(go())


def test_errors_as_rabbitmq_answers_them(target):
    stream = _name("err")

    async def go():
        async with target.producer() as p:
            assert not await p.stream_exists(stream)
            with pytest.raises(Exception) as exc:
                await p.delete_stream(stream)
            assert "StreamDoesNotExist" in type(exc.value).__name__
            client = await p.default_client  # (delete_stream closed the one before)
            with pytest.raises(Exception) as exc:
                await client.declare_publisher(stream=stream, reference="r", publisher_id=3)
            assert "StreamDoesNotExist" in type(exc.value).__name__
            await p.create_stream(stream)
            client = await p.default_client
            await client.declare_publisher(stream=stream, reference="r", publisher_id=3)
            with pytest.raises(Exception) as exc:  # the same id twice on one connection
                await client.declare_publisher(stream=stream, reference="r2", publisher_id=3)
            assert "PreconditionFailed" in type(exc.value).__name__
            await client.delete_publisher(3)
            with pytest.raises(Exception) as exc:
                await client.delete_publisher(3)
            assert "PublisherDoesNotExist" in type(exc.value).__name__
            await p.delete_stream(stream)

    run(go())


def test_wrong_password_is_refused(target):
    async def go():
        p = Producer("127.0.0.1", port=target.port, username="guest", password="wrong")
        with pytest.raises(Exception) as exc:
            await p.start()
        assert "Authentication" in type(exc.value).__name__ or "auth" in str(exc.value).lower()

    run(go())


class _Raw:
    """Frames read off a socket, in order (for the tests that send what no client sends)."""

    def __init__(self, s: socket.socket):
        self.s = s
        self.reader = c.FrameReader(0)
        self.frames: list = []

    def feed(self, data: bytes) -> list:
        return self.reader.feed(data)


def _raw_login(port: int) -> tuple[socket.socket, _Raw]:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    raw = _Raw(s)
    # one request at a time: RabbitMQ 3.10 drops a client that pipelines the handshake
    for cmd in (c.PeerProperties(1, {"product": "raw"}), c.SaslHandshake(2),
                c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest")):
        s.sendall(c.encode(cmd))
        _read_until(s, raw, 0x8000 | cmd.KEY)
    _read_until(s, raw, c.TUNE)
    s.sendall(c.encode(c.Tune(1_048_576, 0)))
    s.sendall(c.encode(c.Open(4, "/")))
    key, _v, payload = _read_until(s, raw, 0x8015)
    assert struct.unpack_from(">IH", payload)[1] == c.OK
    return s, raw


def _read_until(s, raw, key):
    while True:
        while raw.frames:
            frame = raw.frames.pop(0)
            if frame[0] == key:
                return frame
        data = s.recv(65536)
        if not data:
            return None
        raw.frames += raw.feed(data)


def test_unknown_frame_gets_close_13(target):
    s, reader = _raw_login(target.port)
    try:
        s.sendall(struct.pack(">IHH", 8, 0x63, 1) + b"abcd")
        frame = _read_until(s, reader, c.CLOSE)
        assert frame is not None
        close = c.decode(*frame)
        assert (close.code, close.reason) == (c.UNKNOWN_FRAME, "unknown frame")
    finally:
        s.close()


def test_amqplain_and_external_refused(triomq):
    """TrioMQ speaks PLAIN only: other mechanisms get code 7 and the connection ends
    (RabbitMQ 3.10 offers AMQPLAIN too, so this is TrioMQ's alone)."""
    for mech in ("AMQPLAIN", "EXTERNAL"):
        s = socket.create_connection(("127.0.0.1", triomq.port), timeout=WAIT)
        reader = _Raw(s)
        try:
            s.sendall(c.encode(c.PeerProperties(1, {})))
            _read_until(s, reader, 0x8011)
            s.sendall(c.encode(c.SaslHandshake(2)))
            key, _v, payload = _read_until(s, reader, 0x8012)
            assert payload[6:] == struct.pack(">i", 1) + b"\x00\x05PLAIN"
            s.sendall(c.encode(c.SaslAuthenticate(3, mech, b"x")))
            key, _v, payload = _read_until(s, reader, 0x8013)
            assert struct.unpack(">IH", payload) == (3, c.SASL_MECHANISM_NOT_SUPPORTED)
            assert s.recv(10) == b""  # closed
        finally:
            s.close()


def test_oversized_frame_gets_close_14(triomq):
    """Above the negotiated frame_max: Close 14 "frame too large" from the size field
    alone (RabbitMQ 3.10 reads such a frame whole first, so this is TrioMQ's alone)."""
    s, reader = _raw_login(triomq.port)
    try:
        s.sendall(struct.pack(">IHH", 2_000_000, c.PUBLISH, 1))
        close = c.decode(*_read_until(s, reader, c.CLOSE))
        assert (close.code, close.reason) == (c.FRAME_TOO_LARGE, "frame too large")
    finally:
        s.close()


def test_amqp_091_and_stream_protocol_share_the_stream(target):
    """Published over the Stream protocol, consumed by pika from a stream queue, and
    the other way round: one log, one record format (AMQP 1.0 messages)."""
    stream = _name("x")
    conn = pika.BlockingConnection(pika.URLParameters(target.amqp_url))
    try:
        ch = conn.channel()
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        ch.basic_publish("", stream, b"from-amqp",
                         pika.BasicProperties(headers={"h": "v"}, delivery_mode=2))

        async def publish():
            async with target.producer() as p:
                await p.send_wait(stream, AMQPMessage(body=b"from-stream",
                                                      application_properties={"k": "v"}))
            return await _consume(target, stream, 2)

        got = run(publish())
        assert [b for _, b in got] == [b"from-amqp", b"from-stream"]
        ch.basic_qos(prefetch_count=10)
        bodies: list = []
        for method, props, body in ch.consume(stream, arguments={"x-stream-offset": "first"},
                                              inactivity_timeout=WAIT):
            if method is None:
                break
            bodies.append((body, props.headers.get("x-stream-offset")))
            ch.basic_ack(method.delivery_tag)
            if len(bodies) == 2:
                break
        ch.cancel()
        assert bodies == [(b"from-amqp", 0), (b"from-stream", 1)]
        ch.queue_delete(stream)
    finally:
        conn.close()


def test_rbfly_publish_subscribe_and_offsets(target):
    stream = _name("rbfly")

    async def go():
        client = target.rbfly()
        try:
            await client.create_stream(stream)
            async with client.publisher(stream, name="rbfly-pub") as publisher:
                for i in range(3):
                    await publisher.send(b"r%d" % i)
            async with client.publisher(stream, cls=rbs.PublisherBatchFast,
                                        name="rbfly-batch") as publisher:
                for i in range(3, 6):
                    publisher.batch(b"r%d" % i)
                await publisher.flush()
            got = []
            async for msg in client.subscribe(stream, offset=rbs.Offset.FIRST, timeout=WAIT):
                got.append(msg)
                if len(got) == 6:
                    break
            assert got == [b"r%d" % i for i in range(6)]
            await client.write_offset(stream, "rbfly-ref", 4)
            got = []
            for _ in range(100):  # StoreOffset has no answer
                try:
                    async for msg in client.subscribe(stream, offset=rbs.Offset.reference(
                            "rbfly-ref"), timeout=WAIT):
                        got.append(msg)
                        break
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            assert got == [b"r5"]  # (the offset after the stored one)
            await client.delete_stream(stream)
        finally:
            await client.disconnect()

    run(go())


def test_triomq_keeps_offsets_and_publisher_sequences_across_a_restart(triomq):
    stream = _name("restart")

    async def publish():
        async with triomq.consumer() as consumer:
            await consumer.create_stream(stream)
        async with triomq.producer() as p:
            for i in range(3):
                await p.send_wait(stream, AMQPMessage(body=b"p%d" % i), publisher_name="keep")
            client = await p.default_client
            seq = await client.query_publisher_sequence(stream, "keep")
        async with triomq.consumer() as consumer:
            await consumer.store_offset(stream, "app", 2)
            for _ in range(200):
                try:
                    if await consumer.query_offset(stream, "app") == 2:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.05)
        return seq

    seq = run(publish())
    assert seq == 3
    triomq.proc.stop()
    triomq.proc.start()
    triomq.port = triomq.proc.stream_port
    triomq.amqp_url = triomq.proc.url

    async def after():
        async with triomq.producer() as p:
            client = await p.default_client
            seq = await client.query_publisher_sequence(stream, "keep")
        async with triomq.consumer() as consumer:
            offset = await consumer.query_offset(stream, "app")
        got = await _consume(triomq, stream, 3)
        return seq, offset, got

    seq, offset, got = run(after())
    assert (seq, offset) == (3, 2)
    assert [b for _, b in got] == [b"p0", b"p1", b"p2"]


def test_tls_listener(tmp_path):
    """--stream-tls-port with the broker's certificate (RabbitMQ's 5551 is not set up on
    this machine: TrioMQ only)."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls_port = free_port()
    proc = BrokerProc(tmp_path / "data", extra=["--stream-tls-port", str(tls_port),
                                                "--tls-cert", str(cert), "--tls-key", str(key)],
                      wait_ports=(tls_port,))
    proc.start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        stream = _name("tls")

        async def consume_tls():
            got: list = []
            done = asyncio.Event()

            async def on_message(msg, ctx_):
                got.append(bytes(msg.body))
                done.set()

            consumer = Consumer("127.0.0.1", port=tls_port, ssl_context=ctx, username="guest",
                                password="guest")
            await consumer.start()
            await consumer.subscribe(stream, on_message, decoder=amqp_decoder)
            await asyncio.wait_for(done.wait(), WAIT)
            await consumer.close()
            return got

        async def both():
            async with Producer("127.0.0.1", port=tls_port, ssl_context=ctx, username="guest",
                                password="guest") as p:
                await p.create_stream(stream)
                await p.send_wait(stream, AMQPMessage(body=b"secret"))
            return await consume_tls()

        assert run(both()) == [b"secret"]
    finally:
        proc.stop()


def test_super_stream_create_route_publish_delete(triomq):
    """CreateSuperStream, Partitions, Route, rstream's SuperStreamProducer routing by key,
    DeleteSuperStream (RabbitMQ 3.10 has no CreateSuperStream: TrioMQ only)."""
    from rstream import RouteType, SuperStreamProducer

    name = _name("super")
    parts = [f"{name}-{i}" for i in range(3)]

    async def key_of(message):
        return message.application_properties["k"]

    async def go():
        async with triomq.producer() as p:
            client = await p.default_client
            await client.create_super_stream(name, parts, ["0", "1", "2"], {"max-age": "1h"})
            with pytest.raises(Exception) as exc:
                await client.create_super_stream(name, parts, ["0", "1", "2"])
            assert "StreamAlreadyExists" in type(exc.value).__name__
            assert await client.partitions(name) == parts
            assert await client.route("1", name) == [parts[1]]
        # hash routing (rstream's key routing caches the first key's route for all keys)
        producer = SuperStreamProducer(
            "127.0.0.1", port=triomq.port, username="guest", password="guest",
            super_stream=name, routing=RouteType.Hash, routing_extractor=key_of)
        async with producer:
            for i in range(6):
                await producer.send(AMQPMessage(body=b"s%d" % i,
                                                application_properties={"k": str(i)}))
        want: dict = {part: [] for part in parts}
        for i in range(6):  # the client's murmur3 rule, as the Java client's
            h = mmh3.hash_bytes(bytes(str(i), "UTF-16"), 104729)
            want[parts[int.from_bytes(h, "little") % 3]].append(b"s%d" % i)
        got = {part: [b for _, b in await _consume(triomq, part, len(want[part]))]
               if want[part] else [] for part in parts}
        assert got == want
        async with triomq.producer() as p:
            client = await p.default_client
            await client.delete_super_stream(name)
            for part in parts:
                assert not await p.stream_exists(part)

    run(go())


def test_rstream_filtering(triomq):
    """rstream's filtering (RabbitMQ 3.13's): Publish v2 with filter values after
    ExchangeCommandVersions; a subscription with filter values gets the chunks that may
    hold them, rstream's predicate does the rest (RabbitMQ 3.10 has no filtering)."""
    from rstream import FilterConfiguration

    stream = _name("filter")

    async def region(message):
        return message.application_properties["region"]

    async def go():
        async with triomq.producer(filter_value_extractor=region) as p:
            await p.create_stream(stream)
            for i in range(4):
                r = "eu" if i % 2 else "us"
                await p.send_wait(stream, AMQPMessage(body=b"%s%d" % (r.encode(), i),
                                                      application_properties={"region": r}))
        got = await _consume(triomq, stream, 2, filter_input=FilterConfiguration(
            ["eu"], predicate=lambda m: m.application_properties[b"region"] == b"eu"))
        assert [b for _, b in got] == [b"eu1", b"eu3"]
        await _delete(triomq, stream)

    run(go())


def test_rstream_single_active_consumer(triomq):
    """Two rstream consumers of one group: the first is active (ConsumerUpdate, it starts
    where its listener says), the second gets nothing until the first leaves, then is made
    active and starts where its listener says (RabbitMQ 3.10 has no single active consumer
    for streams)."""
    from rstream import OffsetSpecification

    stream = _name("sac")

    async def go():
        async with triomq.producer() as p:
            await p.create_stream(stream)
            for i in range(3):
                await p.send_wait(stream, AMQPMessage(body=b"m%d" % i))
        got: dict = {"one": [], "two": []}
        events = {"one": asyncio.Event(), "two": asyncio.Event()}

        def handler(name, count):
            async def on_message(msg, ctx):
                got[name].append((ctx.offset, bytes(msg.body)))
                if len(got[name]) >= count:
                    events[name].set()
            return on_message

        # where each starts when made active (a listener that queried the stored offset
        # would wait on the connection that runs it)
        starts = iter([0, 2])
        one_closed = [False]
        activations: list = []

        async def on_update(active, ctx):
            activations.append((active, one_closed[0]))
            return OffsetSpecification(OffsetType.OFFSET, next(starts))

        props = {"single-active-consumer": "true", "name": "grp"}
        one, two = triomq.consumer(), triomq.consumer()
        await one.start()
        await two.start()
        await one.subscribe(stream, handler("one", 3), decoder=amqp_decoder, properties=props,
                            subscriber_name="grp", consumer_update_listener=on_update)
        await asyncio.wait_for(events["one"].wait(), WAIT)
        await two.subscribe(stream, handler("two", 1), decoder=amqp_decoder, properties=props,
                            subscriber_name="grp", consumer_update_listener=on_update)
        one_closed[0] = True
        await one.close()
        await asyncio.wait_for(events["two"].wait(), WAIT)
        await two.close()
        # the second was made active only once the first had left
        assert activations == [(True, False), (True, True)]
        assert got["one"] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
        assert got["two"][0] == (2, b"m2")
        await _delete(triomq, stream)

    run(go())
