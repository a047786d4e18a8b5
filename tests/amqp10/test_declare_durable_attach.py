"""AMQP 1.0: an attach that creates a durable queue (the v1 addresses /queue/NAME,
queue://NAME, a plain name) and the management node's PUT /queues, PUT /exchanges and POST
/bindings are answered once the store has made the definition durable, as a
queue.declare-ok (docs/durability.md): a kill -9 right after the answer must not lose the
queue. The connection's later answers wait behind it, in order."""
from __future__ import annotations

import socket

import pytest
import trio
from proton import Disposition, Endpoint, Message
from proton.utils import BlockingConnection

from ..durable_answers import HeldDisk, SlowDiskBroker, journal_broker

WAIT = 30.0


def _connect(port: int) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                              allowed_mechs="PLAIN")


def _answered(link) -> bool:
    return bool(link.state & Endpoint.REMOTE_ACTIVE)


async def test_attach_waits_for_the_definitions_write(tmp_path, nursery):
    broker, server, store, port = await journal_broker(nursery, tmp_path)
    broker.vhosts["/"].declare_queue("tq", durable=False)  # exists: nothing to declare
    disk = HeldDisk(store)
    c = await trio.to_thread.run_sync(_connect, port)
    try:
        links = []

        def attach() -> bool:
            container, conn = c.container, c.conn
            links.append(container.create_sender(conn, "/queue/dq"))  # declares dq
            links.append(container.create_receiver(conn, "queue://dq2"))  # declares dq2
            links.append(container.create_sender(conn, "/amq/queue/tq"))  # declares nothing
            try:
                c.wait(lambda: any(_answered(lk) for lk in links), timeout=0.5)
            except Exception:  # proton's Timeout: nothing answered
                return False
            return True

        assert not await trio.to_thread.run_sync(attach), \
            "an attach answered before the definition was durable"
        disk.release()

        def answered_in_order() -> list[bool]:
            c.wait(lambda: _answered(links[2]), timeout=WAIT)
            return [_answered(lk) for lk in links]

        assert await trio.to_thread.run_sync(answered_in_order) == [True, True, True]
        queues = broker.vhosts["/"].queues
        assert queues["dq"].durable and queues["dq2"].durable
        assert queues["dq2"].consumer_count == 1
    finally:
        disk.release()
        await trio.to_thread.run_sync(c.close)
        await server.shutdown()


async def test_management_answers_wait_for_the_definitions_write(tmp_path, nursery):
    broker, server, store, port = await journal_broker(nursery, tmp_path)
    disk = HeldDisk(store)
    c = await trio.to_thread.run_sync(_connect, port)
    try:
        snd = await trio.to_thread.run_sync(
            lambda: c.create_sender("/management", name="pair"))
        rcv = await trio.to_thread.run_sync(
            lambda: c.create_receiver("/management", name="pair", credit=10))
        requests = [("PUT", "/queues/dq", {"durable": True}),
                    ("PUT", "/exchanges/dx", {"type": "direct", "durable": True}),
                    ("POST", "/bindings", {"source": "dx", "destination_queue": "dq",
                                           "binding_key": "k"}),
                    ("GET", "/queues/dq", None)]

        def send_all() -> bool:
            for i, (method, path, body) in enumerate(requests):
                # pipelined: not waiting for each request's settlement
                snd.link.send(Message(id=str(i), address=path, subject=method,
                                      reply_to="$me", body=body, inferred=False))
            try:
                c.wait(lambda: rcv.fetcher.has_message, timeout=0.5)
            except Exception:  # proton's Timeout: nothing answered
                return False
            return True

        assert not await trio.to_thread.run_sync(send_all), \
            "answered before the definition was durable"
        disk.release()

        def answers() -> list[tuple[str, str]]:
            got = []
            for _ in requests:
                m = rcv.receive(timeout=WAIT)
                got.append((m.correlation_id, m.subject))
            return got

        assert await trio.to_thread.run_sync(answers) == [
            ("0", "201"), ("1", "204"), ("2", "204"), ("3", "200")]
        queues = broker.vhosts["/"].queues
        assert queues["dq"].durable
    finally:
        disk.release()
        await trio.to_thread.run_sync(c.close)
        await server.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_right_after_the_attach_keeps_the_queue(tmp_path):
    """A real broker process whose journal writes are slow: a proton sender attaches to
    /queue/survivor (declaring it), then kill -9 at once; the queue is there after the
    restart."""
    b = SlowDiskBroker(tmp_path / "data")
    b.start()
    try:
        c = _connect(b.port)
        b.slow_disk(True)
        c.create_sender("/queue/survivor")  # returns once the attach is answered
        b.crash_and_restart()
        assert b.queue_exists("survivor")
    finally:
        b.stop()


async def test_a_transfer_flood_behind_a_waiting_attach_is_not_read(tmp_path, nursery):
    """Transfers flooding in on a link with credit while another link's attach waits for
    the disk: the broker holds at most about one read buffer of them (``input_held``) and
    stops reading, so they wait in the client; once released, every one is routed, in
    order."""
    broker, server, store, port = await journal_broker(nursery, tmp_path)
    broker.vhosts["/"].declare_queue("tq", durable=False)
    bound = broker.config.receive_size
    body = b"x" * 65536
    count = 16 * bound // len(body)  # far more than the bound and both sockets' buffers
    c = await trio.to_thread.run_sync(_connect, port)
    try:
        tq = await trio.to_thread.run_sync(c.create_sender, "/amq/queue/tq")
        edge = next(iter(broker.amqp10.handlers))
        # small socket buffers: what the kernel holds stays well under the flood
        edge.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        session = edge.session
        disk = HeldDisk(store)

        def flood() -> list:
            dq = c.container.create_sender(c.conn, "/queue/dq")  # declares dq: held
            sent = [tq.link.send(Message(id=i, body=body)) for i in range(count)]
            c.wait(lambda: _answered(dq) and all(d.remote_state for d in sent),
                   timeout=WAIT)
            return [d.remote_state for d in sent]

        async with trio.open_nursery() as flooding:
            outcomes: list = []

            async def run() -> None:
                outcomes.extend(await trio.to_thread.run_sync(flood))
            flooding.start_soon(run)
            try:
                with trio.fail_after(20):
                    while not (getattr(session, "input_held", False)  # noqa: ASYNC110
                               or outcomes):
                        await trio.sleep(0.01)
                assert not outcomes, "the broker read the whole flood while the attach waited"
                # held: at most the bound and the one read that went past it
                assert session._held_bytes <= 2 * bound
                assert broker.amqp10.service.bytes_received < count * len(body) // 4
            finally:
                disk.release()
        assert outcomes == [Disposition.ACCEPTED] * count
        assert broker.vhosts["/"].queues["dq"].durable

        def received() -> list:
            r = c.create_receiver("/amq/queue/tq", credit=count)
            ids = [r.receive(timeout=WAIT).id for _ in range(count)]
            r.accept()
            return ids
        assert await trio.to_thread.run_sync(received) == list(range(count))
    finally:
        disk.release()
        await trio.to_thread.run_sync(c.close)
