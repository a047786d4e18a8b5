"""The Stream-protocol listener in process, with raw frames (what no client library sends
on purpose): permissions, single active consumer, sub-entry compressions, a deleted
stream, a missed heartbeat."""
from __future__ import annotations

import gzip
import struct

import pytest
import trio
import zstandard

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import MemoryStore
from broker.streamproto import codec as c


@pytest.fixture
async def broker(nursery, tmp_path):
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           stream_port=0), MemoryStore())
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    assert broker.stream is not None
    with trio.fail_after(10):
        while "stream" not in broker.stream.ports:  # noqa: ASYNC110 - binds after AMQP
            await trio.sleep(0.01)
    broker.access.add_user("reader", "pw")
    broker.access.set_permissions("reader", "/", "^$", "^$", ".*")
    yield broker
    await server.shutdown()


class Client:
    def __init__(self, stream):
        self.stream = stream
        self.reader = c.FrameReader(0)
        self.frames: list = []
        self.corr = 100

    async def send(self, *cmds) -> None:
        await self.stream.send_all(b"".join(x if isinstance(x, bytes) else c.encode(x)
                                            for x in cmds))

    async def next(self, key: int | None = None, wait: float = 10):
        with trio.fail_after(wait):
            while True:
                while self.frames:
                    frame = self.frames.pop(0)
                    if key is None or frame[0] == key:
                        return frame
                data = await self.stream.receive_some(1 << 20)
                if not data:
                    return None
                self.frames += self.reader.feed(data)

    async def request(self, cmd) -> tuple[int, bytes]:
        await self.send(cmd)
        _k, _v, payload = await self.next(0x8000 | cmd.KEY)
        corr, code = struct.unpack_from(">IH", payload)
        assert corr == cmd.correlation_id
        return code, bytes(payload[6:])

    def cid(self) -> int:
        self.corr += 1
        return self.corr


async def login(broker, user="guest", password="guest", heartbeat=0,
                frame_max=1 << 20) -> Client:
    stream = await trio.open_tcp_stream("127.0.0.1", broker.stream.ports["stream"])
    cl = Client(stream)
    await cl.send(c.PeerProperties(1, {}), c.SaslHandshake(2),
                  c.SaslAuthenticate(3, "PLAIN", f"\0{user}\0{password}".encode()))
    _k, _v, p = await cl.next(0x8013)
    assert struct.unpack(">IH", p) == (3, c.OK)
    await cl.next(c.TUNE)
    await cl.send(c.Tune(frame_max, heartbeat), c.Open(4, "/"))
    _k, _v, p = await cl.next(0x8015)
    assert struct.unpack_from(">IH", p) == (4, c.OK)
    return cl


async def test_permissions_as_rabbitmq_checks_them(broker):
    admin = await login(broker)
    assert (await admin.request(c.Create(admin.cid(), "perm", {})))[0] == c.OK
    cl = await login(broker, "reader", "pw")
    assert (await cl.request(c.Create(cl.cid(), "other", {})))[0] == c.ACCESS_REFUSED
    assert (await cl.request(c.Delete(cl.cid(), "perm")))[0] == c.ACCESS_REFUSED
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "perm")))[0] == \
        c.ACCESS_REFUSED
    assert (await cl.request(c.Subscribe(cl.cid(), 1, "perm", (c.OFFSET_FIRST, 0), 1,
                                         {})))[0] == c.OK
    assert (await admin.request(c.Create(admin.cid(), "perm", {})))[0] == \
        c.STREAM_ALREADY_EXISTS
    assert (await admin.request(c.Create(admin.cid(), "bad", {"max-age": "zz"})))[0] == \
        c.PRECONDITION_FAILED


async def test_wrong_password_and_unknown_vhost(broker):
    stream = await trio.open_tcp_stream("127.0.0.1", broker.stream.ports["stream"])
    cl = Client(stream)
    await cl.send(c.PeerProperties(1, {}), c.SaslHandshake(2),
                  c.SaslAuthenticate(3, "PLAIN", b"\0guest\0nope"))
    _k, _v, p = await cl.next(0x8013)
    assert struct.unpack(">IH", p) == (3, c.AUTHENTICATION_FAILURE)
    assert await cl.next() is None  # closed
    stream = await trio.open_tcp_stream("127.0.0.1", broker.stream.ports["stream"])
    cl = Client(stream)
    await cl.send(c.PeerProperties(1, {}), c.SaslHandshake(2),
                  c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"))
    await cl.next(c.TUNE)
    await cl.send(c.Tune(0, 0), c.Open(4, "nosuch"))
    _k, _v, p = await cl.next(0x8015)
    assert struct.unpack(">IH", p) == (4, c.VIRTUAL_HOST_ACCESS_FAILURE)


def _deliver_messages(frame) -> list[bytes]:
    _k, version, payload = frame
    return c.decode_chunk(payload[1 if version == 1 else 9:])[1]


async def test_sub_entries_stored_as_sent_and_unsupported_ones_refused(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "sub", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "sub")))[0] == c.OK
    raw = b"".join(c.simple_entry(m) for m in (b"z1", b"z2"))
    zstd = c.SubEntry(c.COMPRESSION_ZSTD, 2, len(raw), zstandard.ZstdCompressor().compress(raw))
    snappy = c.SubEntry(c.COMPRESSION_SNAPPY, 1, 5, b"xxxxx")
    bomb = c.SubEntry(c.COMPRESSION_GZIP, 1, 10, gzip.compress(b"\0" * 10_000_000))
    await cl.send(c.Publish(1, [c.PublishedMessage(1, zstd), c.PublishedMessage(2, snappy),
                                c.PublishedMessage(3, bomb), c.PublishedMessage(4, b"plain")]))
    _k, _v, p = await cl.next(c.PUBLISH_ERROR)
    assert p == struct.pack(">BiQHQH", 1, 2, 2, c.PRECONDITION_FAILED, 3, c.PRECONDITION_FAILED)
    _k, _v, p = await cl.next(c.PUBLISH_CONFIRM)
    assert p == struct.pack(">BiQQ", 1, 2, 1, 4)
    assert (await cl.request(c.Subscribe(cl.cid(), 5, "sub", (c.OFFSET_FIRST, 0), 10,
                                         {})))[0] == c.OK
    frames = [await cl.next(c.DELIVER)]
    got = _deliver_messages(frames[0])
    while len(got) < 3:
        frames.append(await cl.next(c.DELIVER))
        got += _deliver_messages(frames[-1])
    assert got == [b"z1", b"z2", b"plain"]
    # the zstd batch went out as it came in, compressed
    assert c.subentry_entry(zstd) in bytes(frames[0][2])


async def test_single_active_consumer(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "sac", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "sac")))[0] == c.OK
    await cl.send(c.Publish(1, [c.PublishedMessage(1, b"m1")]))
    await cl.next(c.PUBLISH_CONFIRM)
    props = {"single-active-consumer": "true", "name": "app"}
    one, two = await login(broker), await login(broker)
    assert (await one.request(c.Subscribe(one.cid(), 1, "sac", (c.OFFSET_FIRST, 0), 10,
                                          props)))[0] == c.OK
    _k, _v, p = await one.next(c.CONSUMER_UPDATE)
    corr, sub_id, active = struct.unpack(">IBB", p)
    assert (sub_id, active) == (1, 1)
    await one.send(c.ConsumerUpdateResponse(corr, c.OK, (c.OFFSET_FIRST, 0)))
    assert _deliver_messages(await one.next(c.DELIVER)) == [b"m1"]
    assert (await two.request(c.Subscribe(two.cid(), 9, "sac", (c.OFFSET_FIRST, 0), 10,
                                          props)))[0] == c.OK
    assert (await one.request(c.Unsubscribe(one.cid(), 1)))[0] == c.OK
    _k, _v, p = await two.next(c.CONSUMER_UPDATE)
    corr, sub_id, active = struct.unpack(">IBB", p)
    assert (sub_id, active) == (9, 1)
    await two.send(c.ConsumerUpdateResponse(corr, c.OK, (c.OFFSET_OFFSET, 0)))
    assert _deliver_messages(await two.next(c.DELIVER)) == [b"m1"]
    # without a name: refused
    assert (await two.request(c.Subscribe(two.cid(), 10, "sac", (c.OFFSET_FIRST, 0), 10,
                                          {"single-active-consumer": "true"})))[0] == \
        c.PRECONDITION_FAILED


async def test_credit_deleted_stream_and_unknown_subscription(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "gone", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, "ref", "gone")))[0] == c.OK
    for i in range(3):  # three frames, three commits at most: at least one chunk each time
        await cl.send(c.Publish(1, [c.PublishedMessage(i + 1, b"c%d" % i)]))
        await cl.next(c.PUBLISH_CONFIRM)
    assert (await cl.request(c.Subscribe(cl.cid(), 2, "gone", (c.OFFSET_FIRST, 0), 0,
                                         {})))[0] == c.OK
    await cl.send(c.Credit(7, 1))
    _k, _v, p = await cl.next(0x8009)
    assert p == struct.pack(">HB", c.SUBSCRIPTION_ID_DOES_NOT_EXIST, 7)
    await cl.send(c.Credit(2, 1))  # one credit: one chunk
    first = _deliver_messages(await cl.next(c.DELIVER))
    assert first[0] == b"c0"
    other = await login(broker)
    assert (await other.request(c.Delete(other.cid(), "gone")))[0] == c.OK
    _k, _v, p = await cl.next(c.METADATA_UPDATE)
    assert p == struct.pack(">Hh", c.STREAM_NOT_AVAILABLE, 4) + b"gone"
    await cl.send(c.Publish(1, [c.PublishedMessage(9, b"late")]))
    _k, _v, p = await cl.next(c.PUBLISH_ERROR)
    assert p == struct.pack(">BiQH", 1, 1, 9, c.PUBLISHER_DOES_NOT_EXIST)


async def test_missed_heartbeats_close_the_connection(broker, autojump_clock):
    cl = await login(broker, heartbeat=1)
    # nothing sent: the server's heartbeat comes, then the connection ends after 2 s
    assert (await cl.next(c.HEARTBEAT, wait=30))[0] == c.HEARTBEAT
    while (frame := await cl.next(wait=30)) is not None:
        if frame[0] == c.CLOSE:
            assert c.decode(*frame).reason == "missed heartbeats"


async def test_a_stream_deleted_over_amqp_is_announced(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "viaamqp", {})))[0] == c.OK
    assert (await cl.request(c.Subscribe(cl.cid(), 1, "viaamqp", (c.OFFSET_FIRST, 0), 1,
                                         {})))[0] == c.OK
    vhost = broker.vhosts["/"]
    vhost.delete_queue(vhost.queues["viaamqp"])
    _k, _v, p = await cl.next(c.METADATA_UPDATE)
    assert p == struct.pack(">Hh", c.STREAM_NOT_AVAILABLE, 7) + b"viaamqp"


async def test_a_stream_publisher_is_not_read_while_an_alarm_holds(broker, nursery):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "alarmed", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "alarmed")))[0] == c.OK
    service = broker.stream.service
    broker.set_alarm("test alarm", True)
    frame = c.encode(c.Publish(1, [c.PublishedMessage(1, b"x" * 1000)]))
    before = service.bytes_received
    await cl.send(frame)  # the read waiting when the alarm rose takes this one
    with trio.fail_after(10):
        while service.bytes_received < before + len(frame):  # noqa: ASYNC110
            await trio.sleep(0.01)
    read = service.bytes_received

    async def send_more():
        for i in range(100):
            await cl.send(c.Publish(1, [c.PublishedMessage(2 + i, b"y" * 1000)]))

    nursery.start_soon(send_more)
    await trio.sleep(1.0)  # a negative: nothing more is read while the alarm holds
    assert service.bytes_received == read
    broker.set_alarm("test alarm", False)
    confirmed: set = set()
    with trio.fail_after(20):
        while len(confirmed) < 101:
            _k, _v, p = await cl.next(c.PUBLISH_CONFIRM)
            n = struct.unpack_from(">i", p, 1)[0]
            confirmed.update(struct.unpack_from(f">{n}Q", p, 5))
    assert broker.vhosts["/"].queues["alarmed"].log.next_offset == 101


async def test_deliver_v2_and_filtered_chunks(broker):
    cl = await login(broker)
    await cl.send(c.ExchangeCommandVersions(cl.cid(), [(c.DELIVER, 1, 2), (c.PUBLISH, 1, 2)]))
    await cl.next(0x8000 | c.EXCHANGE_COMMAND_VERSIONS)
    assert (await cl.request(c.Create(cl.cid(), "flt", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "flt")))[0] == c.OK
    # two frames, each confirmed (committed) before the next: two chunks
    await cl.send(c.Publish(1, [c.PublishedMessage(1, b"b1", "b"),
                                c.PublishedMessage(2, b"b2", "b")], version=2))
    await cl.next(c.PUBLISH_CONFIRM)
    await cl.send(c.Publish(1, [c.PublishedMessage(3, b"a1", "a")], version=2))
    await cl.next(c.PUBLISH_CONFIRM)
    assert (await cl.request(c.Subscribe(cl.cid(), 4, "flt", (c.OFFSET_FIRST, 0), 10,
                                         {"filter.0": "a"})))[0] == c.OK
    key, version, payload = await cl.next(c.DELIVER)
    assert version == 2 and payload[0] == 4
    committed = struct.unpack_from(">Q", payload, 1)[0]
    header, messages = c.decode_chunk(payload[9:])
    assert messages == [b"a1"] and header["first_offset"] == 2 == committed


async def test_sub_entries_of_one_read_make_one_chunk(broker):
    """rstream sends one Publish frame per sub-entry: those read together are one chunk
    (one Deliver, one credit), as osiris writes a mailbox's worth at once."""
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "joined", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "joined")))[0] == c.OK
    frames = [c.Publish(1, [c.PublishedMessage(i, c.make_subentry([b"j%d" % i, b"k%d" % i]))])
              for i in range(1, 6)]
    frames.append(c.Publish(1, [c.PublishedMessage(6, b"plain")]))
    await cl.send(*frames)
    confirmed: list = []
    while len(confirmed) < 6:
        _k, _v, p = await cl.next(c.PUBLISH_CONFIRM)
        n = struct.unpack_from(">i", p, 1)[0]
        confirmed += struct.unpack_from(f">{n}Q", p, 5)
    assert sorted(confirmed) == [1, 2, 3, 4, 5, 6]
    assert (await cl.request(c.Subscribe(cl.cid(), 2, "joined", (c.OFFSET_FIRST, 0), 10,
                                         {})))[0] == c.OK
    chunks: list = []
    while sum(len(m) for _h, m in chunks) < 11:
        chunks.append(c.decode_chunk((await cl.next(c.DELIVER))[2][1:]))
    assert [m for _h, ms in chunks for m in ms] == \
        [m for i in range(1, 6) for m in (b"j%d" % i, b"k%d" % i)] + [b"plain"]
    # one small write is one read on loopback: one chunk; fewer than one per frame at least
    assert len(chunks) < 6 and chunks[0][0]["num_entries"] > 1


async def test_stream_stats_and_metadata(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "stats", {})))[0] == c.OK
    code, rest = await cl.request(c.StreamStats(cl.cid(), "stats"))
    assert code == c.OK
    assert rest == struct.pack(">i", 2) + b"\x00\x0efirst_chunk_id" + struct.pack(">q", -1) \
        + b"\x00\x12committed_chunk_id" + struct.pack(">q", -1)
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, None, "stats")))[0] == c.OK
    await cl.send(c.Publish(1, [c.PublishedMessage(1, b"a"), c.PublishedMessage(2, b"b")]))
    await cl.next(c.PUBLISH_CONFIRM)
    code, rest = await cl.request(c.StreamStats(cl.cid(), "stats"))
    assert rest.endswith(b"committed_chunk_id" + struct.pack(">q", 0))
    assert (await cl.request(c.StreamStats(cl.cid(), "nosuch")))[0] == c.STREAM_DOES_NOT_EXIST
    corr = cl.cid()
    await cl.send(c.Metadata(corr, ["stats", "nosuch"]))
    _k, _v, p = await cl.next(0x8000 | c.METADATA)
    port = broker.stream.ports["stream"]
    assert p == c.encode_metadata(corr, [(0, "127.0.0.1", port)],
                                  [("stats", c.OK, 0, []),
                                   ("nosuch", c.STREAM_DOES_NOT_EXIST, 0xFFFF, [])])[8:]


async def test_a_failed_write_refuses_its_publishes_and_keeps_the_sequence(broker,
                                                                           monkeypatch):
    """The disk is full: the publishes whose write failed get PublishError 15 (not a
    confirm), and a publisher with a reference may send them again (not deduplicated)."""
    import errno

    from broker.streams import log as logmod

    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "full", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, "ref", "full")))[0] == c.OK
    real = logmod.os.pwrite

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logmod.os, "pwrite", full)
    await cl.send(c.Publish(1, [c.PublishedMessage(1, c.make_subentry([b"a", b"b"])),
                                c.PublishedMessage(2, c.make_subentry([b"c"]))]))
    _k, _v, p = await cl.next(c.PUBLISH_ERROR)
    assert p == struct.pack(">BiQHQH", 1, 2, 1, c.INTERNAL_ERROR, 2, c.INTERNAL_ERROR)
    monkeypatch.setattr(logmod.os, "pwrite", real)
    await cl.send(c.Publish(1, [c.PublishedMessage(1, c.make_subentry([b"a", b"b"])),
                                c.PublishedMessage(2, c.make_subentry([b"c"]))]))
    _k, _v, p = await cl.next(c.PUBLISH_CONFIRM)
    assert p == struct.pack(">BiQQ", 1, 2, 1, 2)
    code, rest = await cl.request(c.QueryPublisherSequence(cl.cid(), "ref", "full"))
    assert (code, rest) == (c.OK, struct.pack(">Q", 2))
    assert (await cl.request(c.Subscribe(cl.cid(), 2, "full", (c.OFFSET_FIRST, 0), 10,
                                         {})))[0] == c.OK
    assert _deliver_messages(await cl.next(c.DELIVER)) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("version", [1, 2])
async def test_a_chunk_above_the_clients_frame_max_is_delivered_in_pieces(broker, version):
    """One chunk of ~40 KB (one Publish frame: one chunk) read by a client that tuned
    frame_max to 4 KiB: every Deliver frame fits (the reader refuses a larger one), the
    pieces are valid chunks (CRC, contiguous offsets) holding every message in order, a
    sub-entry batch stays whole."""
    big = await login(broker)
    assert (await big.request(c.Create(big.cid(), "small-frames", {})))[0] == c.OK
    assert (await big.request(c.DeclarePublisher(big.cid(), 1, None, "small-frames")))[0] \
        == c.OK
    bodies = [b"%04d" % i + b"x" * 396 for i in range(100)]
    batch = [b"sub%d" % i for i in range(20)]
    await big.send(c.Publish(1, [c.PublishedMessage(i + 1, b) for i, b in enumerate(bodies)]
                             + [c.PublishedMessage(101, c.make_subentry(batch))]))
    confirmed: list = []
    while len(confirmed) < 101:
        _k, _v, p = await big.next(c.PUBLISH_CONFIRM)
        n = struct.unpack_from(">i", p, 1)[0]
        confirmed += struct.unpack_from(f">{n}Q", p, 5)
    frame_max = 4096
    cl = await login(broker, frame_max=frame_max)
    cl.reader.max_frame = frame_max  # a Deliver above it raises FrameError here
    if version == 2:
        await cl.send(c.ExchangeCommandVersions(cl.cid(), [(c.DELIVER, 1, 2)]))
        await cl.next(0x8000 | c.EXCHANGE_COMMAND_VERSIONS)
    assert (await cl.request(c.Subscribe(cl.cid(), 3, "small-frames", (c.OFFSET_FIRST, 0),
                                         1000, {})))[0] == c.OK
    messages: list = []
    next_offset = 0
    pieces = 0
    while len(messages) < 120:
        _k, v, payload = await cl.next(c.DELIVER)
        assert v == version
        header, ms = c.decode_chunk(payload[1 if version == 1 else 9:])  # checks the CRC
        assert header["first_offset"] == next_offset and header["num_records"] == len(ms)
        next_offset += len(ms)
        messages += ms
        pieces += 1
    assert messages == bodies + batch
    assert pieces >= 10
