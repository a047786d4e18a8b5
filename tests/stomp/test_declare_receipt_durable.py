"""A STOMP frame that declares a durable queue (SUBSCRIBE or SEND to /queue/NAME, a durable
topic subscription) gets its RECEIPT once the queue's definition is durable, as a
queue.declare-ok (docs/durability.md): a kill -9 right after the RECEIPT must not lose the
queue. The session's later receipts wait behind it, in order."""
from __future__ import annotations

import socket

import pytest
import trio

from broker.stomp.codec import Frame, FrameReader, encode

from ..durable_answers import HeldDisk, SlowDiskBroker, journal_broker

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


async def _frames(stream, reader: FrameReader, n: int) -> list[Frame]:
    got: list[Frame] = []
    with trio.fail_after(20):
        while len(got) < n:
            data = await stream.receive_some(65536)
            assert data, "closed"
            got += reader.feed(data)
    return got


async def test_receipt_waits_for_the_definitions_write(tmp_path, nursery):
    broker, server, store, _ = await journal_broker(nursery, tmp_path, stomp_port=0)
    disk = HeldDisk(store)
    try:
        with trio.fail_after(10):
            while "stomp" not in broker.stomp.ports:  # noqa: ASYNC110 - binds after AMQP
                await trio.sleep(0.01)
        broker.vhosts["/"].declare_queue("tq", durable=False)  # exists: nothing to declare
        stream = await trio.open_tcp_stream("127.0.0.1", broker.stomp.ports["stomp"])
        await stream.send_all(CONNECT)
        reader = FrameReader(1 << 20)
        assert (await _frames(stream, reader, 1))[0].command == "CONNECTED"
        for frame in (
                Frame("SUBSCRIBE", {"destination": "/queue/dq", "id": "1", "receipt": "r1"}),
                Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "2", "durable": "true",
                                    "receipt": "r2"}),
                Frame("SUBSCRIBE", {"destination": "/amq/queue/tq", "id": "3",
                                    "receipt": "r3"}),
                # a transient message: only its queue's definition to wait for
                Frame("SEND", {"destination": "/queue/dq2", "receipt": "r4"}, b"m")):
            await stream.send_all(encode(frame))
        with trio.move_on_after(0.5):
            early = await stream.receive_some(65536)
            raise AssertionError(f"a RECEIPT before the definition was durable: {early!r}")
        disk.release()
        got = await _frames(stream, reader, 4)
        assert [(f.command, f.headers.get("receipt-id")) for f in got] == [
            ("RECEIPT", "r1"), ("RECEIPT", "r2"), ("RECEIPT", "r3"), ("RECEIPT", "r4")]
        queues = broker.vhosts["/"].queues
        assert queues["dq"].durable and queues["dq2"].durable
        await stream.aclose()
    finally:
        disk.release()
        await server.shutdown()


def _receipt(sock: socket.socket, receipt: str) -> None:
    data = b""
    while b"receipt-id:" + receipt.encode() not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before RECEIPT {receipt}: {data!r}"
        data += chunk


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_right_after_the_receipt_keeps_the_queue(tmp_path):
    """A real broker process whose journal writes are slow: the RECEIPT of a SUBSCRIBE that
    declared the queue, then kill -9 at once; the queue is there after the restart."""
    b = SlowDiskBroker(tmp_path / "data")
    b.start()
    try:
        with socket.create_connection(("127.0.0.1", b.stomp_port), timeout=30) as sock:
            sock.sendall(CONNECT)
            data = b""
            while b"CONNECTED" not in data:
                data += sock.recv(65536)
            b.slow_disk(True)
            sock.sendall(encode(Frame("SUBSCRIBE", {"destination": "/queue/survivor",
                                                    "id": "1", "receipt": "r1"})))
            _receipt(sock, "r1")
            b.crash_and_restart()
        assert b.queue_exists("survivor")
    finally:
        b.stop()
