"""A persistent session's SUBSCRIBE (clean session 0, or an MQTT 5 session expiry above 0)
declares a durable queue and binding: its SUBACK is sent once the store has made them
durable, as a queue.declare-ok (docs/durability.md), so a kill -9 right after the SUBACK
keeps the subscription. The retained messages follow the SUBACK; what the client sent
behind the SUBSCRIBE is handled after it, so no later answer overtakes it (a PINGREQ is
answered at once: no order applies to PINGRESP)."""
from __future__ import annotations

import errno
import socket
import threading

import pytest
import trio

from broker.listeners.mqtt_mapping import queue_names
from broker.mqtt import codec as m
from broker.mqtt import properties as P
from broker.mqtt.codec import PacketReader, encode

from ..durable_answers import HeldDisk, SlowDiskBroker, journal_broker

PINGRESP = m.Bare(m.PINGRESP)


class Raw:
    """An MQTT client on a real socket: packets out, packets in."""

    def __init__(self, stream, v5: bool) -> None:
        self.stream = stream
        self.reader = PacketReader()
        self.got: list = []
        if v5:  # the server's packets in v5's format
            self.reader.version = 5
            self.reader.started = True

    @classmethod
    async def connect(cls, port: int, client_id: str, clean: bool, v5: bool = False,
                      will: m.Will | None = None) -> Raw:
        c = cls(await trio.open_tcp_stream("127.0.0.1", port), v5)
        props = {P.SESSION_EXPIRY_INTERVAL: 0 if clean else 3600} if v5 else None
        await c.send(m.Connect(client_id, clean, 60, will=will, protocol_level=5 if v5 else 4,
                               properties=props))
        connack = (await c.read(1))[0]
        assert isinstance(connack, m.ConnAck) and connack.return_code == 0, connack
        return c

    async def send(self, *packets) -> None:
        await self.stream.send_all(b"".join(encode(p) for p in packets))

    async def read(self, n: int) -> list:
        """The next ``n`` packets (what a cancelled read received stays for the next)."""
        with trio.fail_after(20):
            while len(self.got) < n:
                data = await self.stream.receive_some(65536)
                assert data, f"closed after {self.got}"
                self.got += self.reader.feed(data)
        got, self.got = self.got[:n], self.got[n:]
        return got

    def take(self) -> list:
        """What arrived and was not read yet."""
        got, self.got = self.got, []
        return got


def _answers(packets: list) -> list:
    """What the test compares: each packet's type and id (a PUBLISH: its payload, retain)."""
    out = []
    for p in packets:
        if isinstance(p, m.Publish):
            out.append(("PUBLISH", p.payload, p.retain))
        elif isinstance(p, m.SubAck):
            out.append(("SUBACK", p.packet_id))
        elif isinstance(p, m.UnsubAck) or (isinstance(p, m.PacketId)
                                            and p.type == m.UNSUBACK):
            out.append(("UNSUBACK", p.packet_id))
        elif isinstance(p, m.PacketId):
            out.append((p.type, p.packet_id))
        else:
            out.append(p)
    return out


async def _mqtt_broker(nursery, tmp_path):
    """(broker, server, store, MQTT port): ``journal_broker`` with its MQTT listener open."""
    broker, server, store, _ = await journal_broker(nursery, tmp_path, mqtt_port=0)
    with trio.fail_after(10):
        while "mqtt" not in broker.mqtt.ports:  # noqa: ASYNC110 - binds after AMQP
            await trio.sleep(0.01)
    return broker, server, store, broker.mqtt.ports["mqtt"]


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
async def test_suback_waits_for_the_subscriptions_write(tmp_path, nursery, v5):
    broker, server, store, port = await _mqtt_broker(nursery, tmp_path)
    try:
        pub = await Raw.connect(port, "pub", True)
        # a retained message, on disk before the disk is held (its PUBACK says so)
        await pub.send(m.Publish("cfg/x", b"retained", 1, True, False, 1))
        assert _answers(await pub.read(1)) == [(m.PUBACK, 1)]
        disk = HeldDisk(store)
        try:
            dev = await Raw.connect(port, "dev", False, v5)
            # in one write: the SUBSCRIBE, then a QoS 1 PUBLISH that waits for nothing
            # (no queue takes it), an UNSUBSCRIBE and a PINGREQ
            v5_props = {} if v5 else None  # (v5 packets are encoded with properties)
            await dev.send(m.Subscribe(1, [("cfg/#", 1)], v5_props),
                           m.Publish("nowhere", b"n", 1, False, False, 7, v5_props),
                           m.Unsubscribe(2, ["other"], v5_props),
                           m.Bare(m.PINGREQ))
            # published while the SUBACK waits: delivered after the retained message (the
            # PINGRESP says the broker handled the PUBLISH before it)
            await pub.send(m.Publish("cfg/x", b"live", 0, False, False, None),
                           m.Bare(m.PINGREQ))
            assert await pub.read(1) == [PINGRESP]
            with trio.move_on_after(0.5):
                await dev.read(2)
            early = dev.take()
            assert all(p == PINGRESP for p in early), \
                f"answered before the subscription was durable: {early}"
            disk.release()
            got = early + await dev.read(6 - len(early))
        finally:
            disk.release()
        assert got.count(PINGRESP) == 1
        answers = _answers([p for p in got if p != PINGRESP])
        assert answers[:2] == [("SUBACK", 1), ("PUBLISH", b"retained", True)]
        assert [a for a in answers if a[0] != "PUBLISH"] == [
            ("SUBACK", 1), (m.PUBACK, 7), ("UNSUBACK", 2)]
        assert answers[-1] == ("PUBLISH", b"live", False)
        assert broker.vhosts["/"].queues[queue_names("dev")[1]].durable
        await dev.stream.aclose()
        await pub.stream.aclose()
    finally:
        await server.shutdown()


async def test_suback_waits_for_the_retry_while_the_store_fails(tmp_path, nursery):
    """The store contract: while the journal's writes fail (a full disk), the SUBACK is
    neither sent nor refused; it goes once a retry has written the subscription."""
    broker, server, store, port = await _mqtt_broker(nursery, tmp_path)
    write = store._write_chunks
    full = threading.Event()
    full.set()

    def failing(chunks) -> None:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        write(chunks)
    try:
        dev = await Raw.connect(port, "dev", False)
        store._write_chunks = failing
        await dev.send(m.Subscribe(1, [("cmd/#", 1)]), m.Bare(m.PINGREQ))
        assert await dev.read(1) == [PINGRESP]  # the connection lives on meanwhile
        with trio.fail_after(20):
            while store._failed is None:  # noqa: ASYNC110 - the writer's own pace
                await trio.sleep(0.01)
        with trio.move_on_after(0.3):
            await dev.read(1)
        assert dev.take() == [], "a SUBACK while the store could not write"
        full.clear()  # the next retry (a second later) writes
        assert _answers(await dev.read(1)) == [("SUBACK", 1)]
        assert store._failed is None
        await dev.stream.aclose()
    finally:
        full.clear()
        await server.shutdown()


async def test_what_came_behind_a_waiting_suback_takes_effect_when_the_client_leaves(
        tmp_path, nursery):
    """SUBSCRIBE, PUBLISH, DISCONNECT, then the socket closed while the SUBACK waits: the
    publish is routed and the DISCONNECT discards the will, as if answered."""
    broker, server, store, port = await _mqtt_broker(nursery, tmp_path)
    try:
        watch = await Raw.connect(port, "watch", True)
        await watch.send(m.Subscribe(1, [("seen/#", 0)]))
        assert _answers(await watch.read(1)) == [("SUBACK", 1)]
        disk = HeldDisk(store)
        try:
            dev = await Raw.connect(port, "dev", False,
                                    will=m.Will("seen/will", b"gone", 0, False))
            await dev.send(m.Subscribe(1, [("cmd/#", 1)]),
                           m.Publish("seen/data", b"after", 0, False, False, None),
                           m.Bare(m.DISCONNECT))
            await dev.stream.aclose()
            got = await watch.read(1)
            # a will would have gone out with the connection's end, before this answer
            await watch.send(m.Bare(m.PINGREQ))
            got += await watch.read(1)
        finally:
            disk.release()
        assert _answers(got) == [("PUBLISH", b"after", False), PINGRESP]
        assert queue_names("dev")[1] in broker.vhosts["/"].queues
        await watch.stream.aclose()
    finally:
        await server.shutdown()


def _paho(port: int, client_id: str, clean: bool, on_message=None):
    """A connected paho client on its own network thread (``on_message`` set before the
    CONNECT: a stored session's messages follow the CONNACK at once)."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
    connected = threading.Event()
    if on_message is not None:
        c.on_message = on_message
    c.on_connect = lambda *args: connected.set()
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    assert connected.wait(30), "no CONNACK"
    return c


def _close(c) -> None:
    c.disconnect()
    c.loop_stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_right_after_the_suback_keeps_the_subscription(tmp_path):
    """A real broker process whose journal writes are slow: paho's SUBACK of a persistent
    session's first SUBSCRIBE, then kill -9 at once; after the restart the subscription
    queue is there, and a message published to its filter reaches the session."""
    b = SlowDiskBroker(tmp_path / "data")
    b.start()
    try:
        dev = _paho(b.mqtt_port, "survivor", clean=False)
        subscribed = threading.Event()
        dev.on_subscribe = lambda *args: subscribed.set()
        b.slow_disk(True)
        dev.subscribe("jobs/#", qos=1)
        assert subscribed.wait(60), "no SUBACK"
        b.crash_and_restart()
        dev.loop_stop()
        assert b.queue_exists(queue_names("survivor")[1])
        pub = _paho(b.mqtt_port, "pub", clean=True)
        info = pub.publish("jobs/1", b"after the crash", qos=1)
        info.wait_for_publish(30)
        _close(pub)
        got: list = []
        received = threading.Event()
        dev = _paho(b.mqtt_port, "survivor", clean=False,
                    on_message=lambda c, u, msg: (got.append(msg.payload), received.set()))
        assert received.wait(30), "the subscription was lost"
        assert got == [b"after the crash"]
        _close(dev)
    finally:
        b.stop()


def _handler(broker, client_id: str):
    """The broker's edge of the MQTT connection of ``client_id``."""
    return next(h for h in broker.mqtt.handlers if h.session.client_id == client_id)


async def _flood_while_held(tmp_path, nursery, keep_alive: int, held_for: float) -> None:
    """A persistent session's SUBSCRIBE, then QoS 0 PUBLISHes flooding in while the disk is
    held: the broker holds at most about one read buffer of them (``input_held``) and stops
    reading, so the client's send blocks; once released, every one is routed, in order."""
    broker, server, store, port = await _mqtt_broker(nursery, tmp_path)
    bound = broker.config.receive_size
    payload = 4096
    count = (16 * bound) // payload  # far more than the bound and both sockets' buffers
    try:
        watch = await Raw.connect(port, "watch", True)
        await watch.send(m.Subscribe(1, [("flood/#", 0)]))
        assert _answers(await watch.read(1)) == [("SUBACK", 1)]
        dev = Raw(await trio.open_tcp_stream("127.0.0.1", port), False)
        await dev.send(m.Connect("dev", False, keep_alive))
        assert (await dev.read(1))[0].return_code == 0
        # small socket buffers both ways: what the kernel holds stays well under the flood
        dev.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        edge = _handler(broker, "dev")
        edge.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        session = edge.session
        disk = HeldDisk(store)
        sent = trio.Event()

        async def flood() -> None:
            await dev.send(m.Subscribe(1, [("cmd/#", 1)]))
            for i in range(count):
                await dev.send(m.Publish(f"flood/{i}", b"x" * payload, 0, False, False, None))
            sent.set()
        try:
            nursery.start_soon(flood)
            with trio.fail_after(20):
                while not (getattr(session, "input_held", False) or sent.is_set()):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert not sent.is_set(), "the broker read the whole flood while the SUBACK waited"
            # held: at most the bound and the one read that went past it
            assert session._held_bytes <= 2 * bound
            assert broker.mqtt.service.bytes_received < count * payload // 4
            if held_for:  # longer than the keep-alive's 1.5 periods: not timed out
                await trio.sleep(held_for)
            assert not session.finished and not sent.is_set()
        finally:
            disk.release()
        assert _answers(await dev.read(1)) == [("SUBACK", 1)]
        got = []
        with trio.fail_after(30):
            await sent.wait()
            while len(got) < count:
                got += [p.topic for p in await watch.read(1)]
        assert got == [f"flood/{i}" for i in range(count)]
        assert not session.finished
        await dev.stream.aclose()
        await watch.stream.aclose()
    finally:
        await server.shutdown()


async def test_a_publish_flood_behind_a_waiting_suback_is_not_read(tmp_path, nursery):
    await _flood_while_held(tmp_path, nursery, 60, 0)


@pytest.mark.slow
async def test_the_keep_alive_does_not_expire_while_the_broker_does_not_read(
        tmp_path, nursery):
    """As RabbitMQ does for a blocked connection: the client is not timed out for packets
    the broker did not read (its PINGREQs wait in the socket with the flood)."""
    await _flood_while_held(tmp_path, nursery, 1, 2.0)
