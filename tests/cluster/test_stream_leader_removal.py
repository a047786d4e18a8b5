"""delete_replica of a stream's leader (real etcd, three broker processes, pika, rstream,
the ctl command): the leader steps down once its log is confirmed, the others elect the
next leader, the old leader's copy leaves its disk; nothing confirmed is lost, the pika
publisher on the old leader's node gets its confirms (or a clean error), an rstream
reader on a follower reads on through the change, and a reader whose copy is removed is
told (MetadataUpdate), as rabbit_stream_reader tells it."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pika
import pytest

from broker.streams.log import stream_dir

from .test_cluster_nodes import eventually
from .test_mirroring_more import start_together
from .test_quorum_replication import ctl
from .test_stream_replication import (
    STREAM,
    Publisher,
    api_stream,
    chunks,
    full_log,
    logged,
    rstream_bodies,
    stream_node,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class _OnPort:
    """rstream's choice among a stream's replicas (random): the one on ``port``."""

    def __init__(self, port: int):
        self.port = port

    def choice(self, brokers):
        return next((b for b in brokers if b.port == self.port), brokers[0])


class Reader(threading.Thread):
    """An rstream consumer from the first offset, on the replica of the node at ``port``;
    ``closed``: the reasons it was told."""

    def __init__(self, port: int, stream: str):
        super().__init__(daemon=True)
        self.port, self.stream = port, stream
        self.got: list[bytes] = []
        self.closed: list[str] = []
        self.subscribed = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        from rstream import (
            Consumer,
            ConsumerOffsetSpecification,
            MessageContext,
            OffsetType,
            amqp_decoder,
        )

        async def go() -> None:
            async def on_message(msg, ctx: MessageContext):
                self.got.append(bytes(msg.body))

            def on_close(info) -> None:
                self.closed.append(info.reason)

            import rstream.consumer as module
            consumer = Consumer("127.0.0.1", port=self.port, username="guest",
                                password="guest", on_close_handler=on_close)
            await consumer.start()
            try:
                chooser, module.random = module.random, _OnPort(self.port)  # type: ignore
                try:
                    await consumer.subscribe(
                        self.stream, on_message, decoder=amqp_decoder,
                        offset_specification=ConsumerOffsetSpecification(
                            OffsetType.FIRST, None))
                finally:
                    module.random = chooser
                self.subscribed.set()
                await asyncio.to_thread(self.stop.wait)
            finally:
                try:
                    await asyncio.wait_for(consumer.close(), 10)
                except Exception:
                    pass
        asyncio.run(go())


@pytest.mark.timeout(240)
def test_delete_replica_of_the_leader_elects_another_and_loses_nothing_confirmed(
        tmp_path, etcd, secret):
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    reader = None
    try:
        conn = a.connect()
        conn.channel().queue_declare("s", durable=True, arguments=STREAM)
        conn.close()
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        reader = Reader(c.stream_port, "s")  # reads c's own copy
        reader.start()
        assert reader.subscribed.wait(30)
        bodies = [b"d%05d" % i for i in range(2000)]
        p = Publisher(a, "s", bodies)
        p.start()

        def enough() -> None:
            assert len(p.confirmed) >= 200 or p.error is not None, len(p.confirmed)
        eventually(enough, timeout=60)
        r = ctl(b, "delete_replica", "s", "a")
        assert r.returncode == 0, r.stdout + r.stderr
        p.join(120)
        assert not p.is_alive()
        confirmed = list(p.confirmed)  # the rest: a clean error (p.error), or all confirmed
        assert len(confirmed) >= 200

        view: dict = {}

        def elected() -> None:
            view.update(api_stream(b, "s"))
            assert view["members"] == ["b", "c"] and view["leader"] in ("b", "c"), view
        eventually(elected, timeout=60)
        logged(a, "steps down as its leader")
        assert not Path(stream_dir(str(a.data_dir), "/", "s")).exists()
        leader, other = (b, c) if view["leader"] == "b" else (c, b)
        got = rstream_bodies(leader.stream_port, "s", set(confirmed))
        assert got[:len(confirmed)] == confirmed
        # a's queue is a proxy of the new leader now: a publish there is confirmed
        conn = a.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "s", b"after", PERSISTENT)
        conn.close()
        # the reader on c read on through the change of leader
        eventually(lambda: assert_has(reader.got, set(confirmed) | {b"after"}), timeout=60)
        assert reader.closed == []

        # the follower leaves the group: its copy closes and goes, and the reader of that
        # copy is told, as RabbitMQ's reader is when its member goes
        second = Reader(other.stream_port, "s")
        second.start()
        assert second.subscribed.wait(30)
        eventually(lambda: assert_has(second.got, {b"after"}), timeout=60)
        r = ctl(leader, "delete_replica", "s", "c" if view["leader"] == "b" else "b")
        assert r.returncode == 0, r.stdout + r.stderr
        eventually(lambda: assert_has(second.closed, {"Metadata Update"}), timeout=60)
        assert api_stream(leader, "s")["members"] == [view["leader"]]
        assert "ReplicaGap" not in full_log(leader)
        second.stop.set()
        second.join(15)
    finally:
        if reader is not None:
            reader.stop.set()
            reader.join(15)
        for broker in (a, b, c):
            broker.stop()
    kept = chunks(leader, "s")
    records = [r for _i, rs in kept for _o, r in rs]
    assert len(records) >= len(confirmed) + 1


def assert_has(items, want: set) -> None:
    assert want <= set(items), (len(items), len(want - set(items)))


def test_a_copy_left_aside_by_a_stop_is_the_copy_again(tmp_path):
    """A deposed leader stopped between its queue's deletion and the link back of its log
    (stream_stepdown.keeping_copy): its follower finds the files aside and reads them."""
    from broker.cluster.stream_stepdown import KEPT, restore_kept
    from broker.streams.log import StreamLog

    directory = str(tmp_path / "s")
    lg = StreamLog(directory)
    lg.append([b"one", b"two"])
    lg.commit()
    lg.close()
    Path(directory).rename(directory + KEPT)
    restore_kept(directory)
    assert not Path(directory + KEPT).exists()
    lg = StreamLog(directory)
    assert lg.next_offset == 2
    lg.close()
    # a copy there already (a later one): what was aside goes
    Path(directory + KEPT).mkdir()
    (Path(directory + KEPT) / "x.segment").write_bytes(b"")
    restore_kept(directory)
    assert not Path(directory + KEPT).exists() and StreamLog(directory).next_offset == 2
