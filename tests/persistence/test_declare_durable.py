"""queue.declare-ok of a durable queue is sent once the store has made its definition
durable (the journal's group commit), as docs/durability.md promises: a kill -9 right after
a declare-ok must not lose the queue. The channel's later replies wait behind it."""
from __future__ import annotations

import struct
import threading

import trio

from broker.amqp import spec
from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import open_store

from ..support import TrioClient


async def test_declare_ok_waits_for_the_definitions_write(tmp_path, nursery):
    data = str(tmp_path / "data")
    config = Config(host="127.0.0.1", port=0, data_dir=data, memory_limit_bytes=1 << 50,
                    disk_free_limit=0, heartbeat=0)
    store = open_store("journal", data, config.flush, config.journal)
    server = Server(Broker(config, store))
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    try:
        c = await TrioClient.connect(port)
        await c.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
        disk = threading.Event()  # a slow disk: the journal's write waits for it
        write = store._write_chunks

        def slow_write(chunks) -> None:
            disk.wait(10)
            write(chunks)
        store._write_chunks = slow_write
        for q, args in (("dq", {}), ("ds", {"x-queue-type": "stream"})):
            await c.call(1, spec.Queue.Declare(queue=q, durable=True, arguments=args))
        await c.call(1, spec.Queue.Declare(queue="tq", durable=False))  # nothing to store
        with trio.move_on_after(0.3):
            early = await c.next()
            raise AssertionError(f"answered before the definition was durable: {early}")
        disk.set()
        got = [(await c.expect(spec.Queue.DeclareOk)).method.queue for _ in range(3)]
        assert got == ["dq", "ds", "tq"]  # in request order
        await c.aclose()
    finally:
        disk.set()
        await server.shutdown()


async def test_stream_protocol_create_answers_once_the_definition_is_durable(tmp_path, nursery):
    from broker.streamproto import codec as sc

    from ..streamproto.test_session import login
    data = str(tmp_path / "data")
    config = Config(host="127.0.0.1", port=0, data_dir=data, memory_limit_bytes=1 << 50,
                    disk_free_limit=0, heartbeat=0, stream_port=0)
    store = open_store("journal", data, config.flush, config.journal)
    broker = Broker(config, store)
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    disk = threading.Event()
    try:
        assert broker.stream is not None
        with trio.fail_after(10):
            while "stream" not in broker.stream.ports:  # noqa: ASYNC110 - binds after AMQP
                await trio.sleep(0.01)
        cl = await login(broker)
        write = store._write_chunks

        def slow_write(chunks) -> None:
            disk.wait(10)
            write(chunks)
        store._write_chunks = slow_write
        await cl.send(sc.Create(cl.cid(), "s1", {}))
        with trio.move_on_after(0.3):
            early = await cl.next()
            raise AssertionError(f"answered before the definition was durable: {early}")
        disk.set()
        _k, _v, payload = await cl.next(0x8000 | sc.Create.KEY)
        assert struct.unpack_from(">IH", payload)[1] == sc.OK
        await cl.stream.aclose()
    finally:
        disk.set()
        await server.shutdown()
