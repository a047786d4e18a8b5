"""Hostile input at the Stream-protocol edge, in process with raw frames: what no client
library sends. Each gets the protocol's response code (or Close with its code) and the
connection, the broker and other clients go on (bench/hostile_edges.py measures the same
against a subprocess with a memory limit)."""
from __future__ import annotations

import gzip
import struct
import zlib

import trio

from broker.streamproto import codec as c
from broker.streams import super as ss

from .test_session import broker, login

__all__ = ["broker"]


async def test_a_super_stream_past_the_partition_bound_is_refused_at_once(broker):
    cl = await login(broker)
    n = ss.MAX_PARTITIONS + 1
    parts = [f"hs-{i}" for i in range(n)]
    with trio.fail_after(30):
        code, _ = await cl.request(c.CreateSuperStream(cl.cid(), "hs", parts,
                                                       [str(i) for i in range(n)], {}))
    assert code == c.PRECONDITION_FAILED
    vhost = broker.vhosts["/"]
    assert "hs" not in vhost.exchanges and "hs-0" not in vhost.queues
    code, _ = await cl.request(c.CreateSuperStream(cl.cid(), "hs", parts[:3],
                                                   ["0", "1", "2"], {}))
    assert code == c.OK


def _create_frame(corr: int, raw_name: bytes) -> bytes:
    frame = struct.pack(">HHI", c.CREATE, 1, corr) + struct.pack(">H", len(raw_name)) \
        + raw_name + struct.pack(">i", 0)
    return struct.pack(">I", len(frame)) + frame


async def test_odd_names_get_a_response_code(broker):
    """A name past 255 bytes (the longest a string can be: 32,767) is refused with its code;
    one that is not UTF-8 is a frame the codec refuses: Close with unknown frame."""
    cl = await login(broker)
    await cl.send(_create_frame(11, b"n" * 32767))
    frame = await cl.next(0x8000 | c.CREATE)
    assert struct.unpack_from(">IH", frame[2]) == (11, c.PRECONDITION_FAILED)
    code, _ = await cl.request(c.Create(cl.cid(), "a\0b", {}))  # any UTF-8, as RabbitMQ
    assert code == c.OK
    await cl.send(_create_frame(12, b"a\xff\xfeb"))
    frame = await cl.next(c.CLOSE)
    assert struct.unpack_from(">IH", frame[2])[1] == c.UNKNOWN_FRAME
    other = await login(broker)
    assert (await other.request(c.Create(other.cid(), "fine", {})))[0] == c.OK


async def test_offsets_past_the_log_and_negative_timestamps(broker):
    cl = await login(broker)
    assert (await cl.request(c.Create(cl.cid(), "offs", {})))[0] == c.OK
    for sub, spec in enumerate([(c.OFFSET_OFFSET, (1 << 64) - 1), (c.OFFSET_TIMESTAMP, -1),
                                (c.OFFSET_TIMESTAMP, -(1 << 63))]):
        code, _ = await cl.request(c.Subscribe(cl.cid(), sub, "offs", spec, 65535, {}))
        assert code == c.OK, spec
    code, _ = await cl.request(c.Create(cl.cid(), "still-served", {}))
    assert code == c.OK


async def test_create_arguments_no_field_holds_are_refused_with_a_code(broker):
    """Digits that int() refuses ('²' is a digit to str.isdigit; 5,000 digits pass Python's
    limit) or numbers past 64 bits: precondition failed, the connection goes on."""
    cl = await login(broker)
    for value in ("²", "9" * 5000, "9" * 20):
        code, _ = await cl.request(c.Create(cl.cid(), "argy", {"max-length-bytes": value}))
        assert code == c.PRECONDITION_FAILED, value[:10]
        assert "argy" not in broker.vhosts["/"].queues
    code, _ = await cl.request(c.Create(cl.cid(), "argy", {"max-length-bytes": "1000"}))
    assert code == c.OK


async def test_compressed_subentries_of_one_read_inflate_at_most_max_message_size(nursery,
                                                                                   tmp_path):
    """Inflating runs on the event loop: the gzip batches of one read may declare at most
    max_message_size in all (before: eight 128 MiB bombs in one frame, 8-13 s of loop for
    every other client); the ones past it get precondition failed, the rest are kept."""
    from broker.broker import Broker
    from broker.config import Config
    from broker.listeners.amqp import Server
    from broker.persistence import MemoryStore
    limit = 1 << 20
    b = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                      memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                      stream_port=0, max_message_size=limit), MemoryStore())
    server = Server(b)
    await nursery.start(server.serve, "127.0.0.1", 0)
    with trio.fail_after(10):
        while b.stream is None or "stream" not in b.stream.ports:  # noqa: ASYNC110
            await trio.sleep(0.01)
    cl = await login(b)
    assert (await cl.request(c.Create(cl.cid(), "bombs", {})))[0] == c.OK
    assert (await cl.request(c.DeclarePublisher(cl.cid(), 1, "", "bombs")))[0] == c.OK
    size = limit * 3 // 5
    raw = struct.pack(">I", size - 4) + bytes(size - 4)
    bomb = c.SubEntry(c.COMPRESSION_GZIP, 1, size, gzip.compress(raw))
    await cl.send(c.Publish(1, [c.PublishedMessage(i, bomb) for i in (1, 2, 3)]))
    confirmed, refused = [], []
    with trio.fail_after(30):
        while len(confirmed) + len(refused) < 3:
            key, _v, payload = await cl.next()
            if key == c.PUBLISH_CONFIRM:
                n = struct.unpack_from(">BI", payload)[1]
                confirmed += struct.unpack_from(f">{n}Q", payload, 5)
            elif key == c.PUBLISH_ERROR:
                n = struct.unpack_from(">BI", payload)[1]
                pos = 5
                for _ in range(n):
                    pid, code = struct.unpack_from(">QH", payload, pos)
                    refused.append((pid, code))
                    pos += 10
    assert confirmed == [1]
    assert refused == [(2, c.PRECONDITION_FAILED), (3, c.PRECONDITION_FAILED)]
    # a read later: the budget is whole again
    await cl.send(c.Publish(1, [c.PublishedMessage(4, bomb)]))
    key, _v, payload = await cl.next(c.PUBLISH_CONFIRM)
    assert struct.unpack_from(">BIQ", payload)[2] == 4
    await server.shutdown()


async def test_a_bomb_being_inflated_does_not_hold_other_connections(broker):
    """Inflating a compressed sub-entry batch takes a few MiB per turn of the event loop:
    while one connection's 128 MiB gzip bomb is checked (and refused: its records do not
    add up), another connection's round trips stay fast (before: the whole bomb at once
    on the loop, 0.3-2 s of it for every other client)."""
    a = await login(broker)
    b = await login(broker)
    assert (await a.request(c.Create(a.cid(), "bombed", {})))[0] == c.OK
    assert (await a.request(c.DeclarePublisher(a.cid(), 1, "", "bombed")))[0] == c.OK
    mib = 1 << 20
    size = 96 * mib
    z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip, a MiB at a time
    zeros = bytes(mib)
    data = z.compress(struct.pack(">I", size - 4) + bytes(mib - 4)) + b"".join(
        z.compress(zeros) for _ in range(size // mib - 1)) + z.flush()
    bomb = c.SubEntry(c.COMPRESSION_GZIP, 2, size, data)
    refused = trio.Event()

    async def bomb_refused():
        _k, _v, payload = await a.next(c.PUBLISH_ERROR, wait=60)
        assert struct.unpack_from(">BIQH", payload)[2:] == (1, c.PRECONDITION_FAILED)
        refused.set()

    rtts = []
    async with trio.open_nursery() as n:
        n.start_soon(bomb_refused)
        start = trio.current_time()
        await a.send(c.Publish(1, [c.PublishedMessage(1, bomb)]))
        while not refused.is_set():
            t0 = trio.current_time()
            code, _ = await b.request(c.QueryOffset(b.cid(), "nobody", "bombed"))
            assert code == c.NO_OFFSET
            rtts.append(trio.current_time() - t0)
            await trio.sleep(0.005)
        took = trio.current_time() - start
    assert len(rtts) >= 3, (took, rtts)
    assert max(rtts) < 0.25 and max(rtts) < took / 3, (took, max(rtts))
    # the connection reads again and goes on as before
    assert (await a.request(c.QueryPublisherSequence(a.cid(), "", "bombed")))[0] == c.OK
