"""The STOMP listener's trio edge: resource alarms stop reading publishers, heart-beats
both ways, the CONNECT pipelined with frames behind it."""
from __future__ import annotations

import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import MemoryStore
from broker.stomp.codec import Frame, FrameReader, encode

ALARM = "test alarm"
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


@pytest.fixture
async def stomp_broker(nursery, tmp_path):
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           stomp_port=0), MemoryStore())
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    assert broker.stomp is not None
    with trio.fail_after(10):
        while "stomp" not in broker.stomp.ports:  # noqa: ASYNC110 - binds after AMQP
            await trio.sleep(0.01)
    yield broker
    await server.shutdown()


async def _frames(stream, reader: FrameReader, n: int) -> list[Frame]:
    got: list[Frame] = []
    with trio.fail_after(10):
        while len(got) < n:
            data = await stream.receive_some(65536)
            assert data, "closed"
            got += reader.feed(data)
    return got


async def _connect(broker, connect: bytes = CONNECT):
    stream = await trio.open_tcp_stream("127.0.0.1", broker.stomp.ports["stomp"])
    await stream.send_all(connect)
    reader = FrameReader(1 << 20)
    connected = (await _frames(stream, reader, 1))[0]
    assert connected.command == "CONNECTED"
    return stream, reader


async def test_a_stomp_publisher_is_not_read_while_an_alarm_holds(stomp_broker, nursery):
    service = stomp_broker.stomp.service
    stream, _ = await _connect(stomp_broker)
    send = encode(Frame("SEND", {"destination": "/queue/alarmed"}, b"x" * 1000))
    await stream.send_all(send)
    with trio.fail_after(10):
        while not any(getattr(s, "is_publisher", False) for s in stomp_broker.sessions):  # noqa: ASYNC110
            await trio.sleep(0.01)
    stomp_broker.set_alarm(ALARM, True)
    await stream.send_all(send)  # the read waiting when the alarm rose takes this one
    with trio.fail_after(10):
        while service.bytes_received < len(CONNECT) + 2 * len(send):  # noqa: ASYNC110
            await trio.sleep(0.01)
    read = service.bytes_received

    async def send_more():
        for _ in range(300):
            await stream.send_all(send)

    nursery.start_soon(send_more)
    await trio.sleep(1.0)  # a negative: nothing is read while the alarm holds
    assert service.bytes_received == read
    stomp_broker.set_alarm(ALARM, False)
    with trio.fail_after(10):
        while service.bytes_received < read + 300 * len(send):  # noqa: ASYNC110
            await trio.sleep(0.01)
    q = stomp_broker.vhosts["/"].queues["alarmed"]
    with trio.fail_after(10):
        while q.message_count < 302:  # noqa: ASYNC110
            await trio.sleep(0.01)
    await stream.aclose()


async def test_heartbeats_both_ways(stomp_broker):
    # the client sends nothing although it offered one every 200 ms: closed after 2 periods
    stream, reader = await _connect(stomp_broker, CONNECT.replace(
        b"\n\n\x00", b"\nheart-beat:200,100\n\n\x00"))
    started = trio.current_time()
    newlines = 0
    with trio.fail_after(10):
        while True:
            data = await stream.receive_some(100)
            if not data:
                break
            newlines += data.count(b"\n")
    assert newlines >= 2  # the server's, every 100 ms
    assert trio.current_time() - started >= 0.35
    # a client that keeps sending its heart-beats stays connected
    stream, reader = await _connect(stomp_broker, CONNECT.replace(
        b"\n\n\x00", b"\nheart-beat:100,0\n\n\x00"))
    for _ in range(8):
        await stream.send_all(b"\n")
        await trio.sleep(0.05)
    await stream.send_all(b"DISCONNECT\nreceipt:bye\n\n\x00")
    (receipt,) = await _frames(stream, reader, 1)
    assert receipt.headers["receipt-id"] == "bye"


async def test_frames_pipelined_behind_connect(stomp_broker):
    stream = await trio.open_tcp_stream("127.0.0.1", stomp_broker.stomp.ports["stomp"])
    await stream.send_all(CONNECT + b"SUBSCRIBE\ndestination:/queue/p\nid:1\n\n\x00"
                                    b"SEND\ndestination:/queue/p\n\nhi\x00")
    connected, msg = await _frames(stream, FrameReader(1 << 20), 2)
    assert connected.command == "CONNECTED"
    assert (msg.command, msg.body) == ("MESSAGE", b"hi")
    await stream.aclose()


async def test_disconnect_receipt_waits_for_the_receipts_held_for_the_store(nursery, tmp_path):
    """On the journal (sync flush) a persistent SEND's receipt waits for the fsync; the
    DISCONNECT's receipt right behind it used to be dropped as the connection ended."""
    from broker.persistence import open_store
    data_dir = tmp_path / "data"
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(data_dir),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           stomp_port=0), open_store(None, str(data_dir), "sync"))
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    try:
        with trio.fail_after(10):
            while "stomp" not in broker.stomp.ports:  # noqa: ASYNC110 - binds after AMQP
                await trio.sleep(0.01)
        stream, reader = await _connect(broker)
        await stream.send_all(
            b"SEND\ndestination:/queue/kept\npersistent:true\nreceipt:r1\n\nx\x00"
            b"DISCONNECT\nreceipt:bye\n\n\x00")
        frames = await _frames(stream, reader, 2)
        assert [f.headers.get("receipt-id") for f in frames] == ["r1", "bye"]
        with trio.fail_after(10):
            assert await stream.receive_some(100) == b""  # then the server closes
        await stream.aclose()
    finally:
        await server.shutdown()


@pytest.fixture
async def journal_stomp_broker(nursery, tmp_path):
    from broker.persistence.journal import JournalStore
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           stomp_port=0), JournalStore(str(tmp_path / "journal")))
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    with trio.fail_after(10):
        while "stomp" not in broker.stomp.ports:  # noqa: ASYNC110 - binds after AMQP
            await trio.sleep(0.01)
    yield broker
    await server.shutdown()


@pytest.mark.parametrize("command", ["SUBSCRIBE", "SEND"])
async def test_a_queue_argument_past_64_bits_is_an_error_frame(journal_stomp_broker, command):
    """An x-* header declaring a durable queue with a number no AMQP field holds: an ERROR
    frame naming the header (before: struct.error in the store's check, the connection
    dropped without a word and a traceback logged), nothing declared, the broker goes on."""
    stomp_broker = journal_stomp_broker
    stream, reader = await _connect(stomp_broker)
    headers = {"destination": "/queue/huge-arg", "id": "1", "receipt": "r",
               "x-max-length": "-99999999999999999999"}
    await stream.send_all(encode(Frame(command, headers, b"")))
    error = (await _frames(stream, reader, 1))[0]
    assert error.command == "ERROR", error
    assert "x-max-length" in error.body.decode() + error.headers.get("message", "")
    assert "huge-arg" not in stomp_broker.vhosts["/"].queues
    stream2, reader2 = await _connect(stomp_broker)
    await stream2.send_all(encode(Frame("SUBSCRIBE", {"destination": "/queue/fine", "id": "1",
                                                      "receipt": "ok"}, b"")))
    assert (await _frames(stream2, reader2, 1))[0].command == "RECEIPT"
