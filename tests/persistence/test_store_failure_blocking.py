"""A journal whose writes fail on a REAL full disk (a small tmpfs) blocks its publishers
as the memory and disk alarms do: their sockets are not read at all (0 bytes) until the
writes succeed again, while a consumer on another connection keeps being read (its acks
are handled). The broker and the client run in this process so that the bytes the
broker read are counted exactly (``conn.recv_oct``).

Needs root (``mount -t tmpfs``); skipped where mounting is not permitted.
"""
from __future__ import annotations

import os

import trio

from broker.amqp import spec
from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.listeners.amqp import Server
from broker.persistence import open_store

from ..support import TrioClient
from .test_full_disk import fill, tmpfs

SEGMENT = 1024 * 1024
BODY = 16 * 1024
PERSISTENT = {"delivery_mode": 2}


async def _wait_for(cond, what: str, within: float = 60.0) -> None:
    with trio.fail_after(within):
        while not cond():  # noqa: ASYNC110 - polling the broker's state
            await trio.sleep(0.02)


def _handler(server, publisher: bool):
    found = [h for h in server.handlers if h.session.is_publisher == publisher]
    return found[0] if len(found) == 1 else None


async def test_a_failing_journal_blocks_its_publishers_not_a_byte_read(tmp_path, nursery):
    with tmpfs(tmp_path / "disk", 16) as disk:
        data = os.path.join(disk, "data")
        os.makedirs(data)
        journal = JournalSettings(segment_size=SEGMENT, checkpoint_bytes=4 * SEGMENT)
        config = Config(host="127.0.0.1", port=0, data_dir=data, journal=journal,
                        memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0)
        broker = Broker(config, open_store("journal", data, config.flush, journal))
        server = Server(broker)
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        try:
            sub = await TrioClient.connect(port)
            await sub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
            await sub.call(1, spec.Queue.Declare(queue="q", durable=True), spec.Queue.DeclareOk)
            await sub.call(1, spec.Basic.Qos(0, 1, False), spec.Basic.QosOk)
            ballast = fill(disk, 2 * SEGMENT)

            # no confirms: the write failure does not close it, the alarm blocks it
            pub = await TrioClient.connect(port)
            await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
            sent = 0
            with trio.fail_after(120):
                while "journal" not in broker.alarms:
                    await pub.publish(1, b"%d:" % sent + b"." * BODY, routing_key="q",
                                      **PERSISTENT)
                    sent += 1
                    await trio.sleep(0.005)
            handler = _handler(server, publisher=True)
            assert handler is not None
            await _wait_for(lambda: handler.alarm_blocked, "the publisher blocked")
            read = handler.session.conn.recv_oct
            more = trio.Event()

            async def publish_more():  # what the kernel's buffers do not take waits here
                for i in range(200):
                    await pub.publish(1, b"late %d:" % i + b"." * BODY, routing_key="q",
                                      **PERSISTENT)
                more.set()

            nursery.start_soon(publish_more)
            # The consumer is read and served meanwhile: with a prefetch of 1, each next
            # delivery shows that the previous ack was read and handled.
            await sub.call(1, spec.Basic.Consume(queue="q"), spec.Basic.ConsumeOk)
            for _ in range(3):
                d = await sub.expect(spec.Basic.Deliver, within=30)
                await sub.call(1, spec.Basic.Ack(d.method.delivery_tag, False))
            await sub.expect(spec.Basic.Deliver, within=30)
            # A negative: the old slow read let 4 KiB through every 0.1 s (~60 KB here).
            await trio.sleep(1.5)
            assert "journal" in broker.alarms
            assert handler.session.conn.recv_oct == read, "a blocked publisher was read"
            assert handler in server.handlers

            os.unlink(ballast)
            await _wait_for(lambda: "journal" not in broker.alarms, "the journal's recovery")
            await _wait_for(lambda: handler.session.conn.recv_oct > read, "the publisher read again")
            with trio.fail_after(60):
                await more.wait()
            await pub.aclose()
            await sub.aclose()
        finally:
            await server.shutdown()
