"""MQTT size limits and resource alarms at the real listener: the CONNECT (read before any
login) is bounded as RabbitMQ bounds it, and a publisher is not read while an alarm holds."""
from __future__ import annotations

import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.mqtt import codec as m
from broker.mqtt.codec import MAX_UNAUTHENTICATED, MalformedPacket, PacketReader, encode
from broker.persistence import MemoryStore

ALARM = "test alarm"  # raised by hand (the resource monitor sets memory and disk itself)


def test_the_first_packet_is_bounded_separately():
    reader = PacketReader(max_first=1000)
    with pytest.raises(MalformedPacket, match="exceeds the limit of 1000"):
        reader.feed(b"\x10\xa0\x8d\x06")  # a CONNECT declaring 100,000 bytes: refused at once
    reader = PacketReader(max_first=1000)
    big = m.Publish("t", b"x" * 100_000)
    assert reader.feed(encode(m.Connect("c")) + encode(big)) == [m.Connect("c"), big]


@pytest.fixture
async def mqtt_broker(nursery, tmp_path):
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           mqtt_port=0), MemoryStore())
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    assert broker.mqtt is not None
    with trio.fail_after(10):
        while "mqtt" not in broker.mqtt.ports:  # noqa: ASYNC110 - the listener binds after AMQP
            await trio.sleep(0.01)
    yield broker
    await server.shutdown()


async def _closed(stream, within: float) -> bool:
    with trio.move_on_after(within):
        try:
            while await stream.receive_some(4096):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


async def test_a_large_connect_is_refused_before_it_arrives(mqtt_broker):
    stream = await trio.open_tcp_stream("127.0.0.1", mqtt_broker.mqtt.ports["mqtt"])
    # a CONNECT declaring 1,000,000 bytes and 70,000 of them: closed (the CONNECT timeout,
    # 10 s, would otherwise end it)
    await stream.send_all(b"\x10\xc0\x84\x3d" + b"\0" * 70_000)
    assert MAX_UNAUTHENTICATED < 1_000_000
    assert await _closed(stream, within=5)
    await stream.aclose()


async def test_an_mqtt_publisher_is_not_read_while_an_alarm_holds(mqtt_broker, nursery):
    service = mqtt_broker.mqtt.service
    stream = await trio.open_tcp_stream("127.0.0.1", mqtt_broker.mqtt.ports["mqtt"])
    await stream.send_all(encode(m.Connect("pub", True, 0)))
    assert (await stream.receive_some(4))[:1] == b"\x20"  # CONNACK
    publish = encode(m.Publish("a/b", b"x" * 1000))
    await stream.send_all(publish)
    with trio.fail_after(10):
        while not any(s.is_publisher for s in mqtt_broker.sessions  # noqa: ASYNC110
                      if hasattr(s, "client_id")):
            await trio.sleep(0.01)
    mqtt_broker.set_alarm(ALARM, True)
    await stream.send_all(publish)  # the read waiting when the alarm rose takes this one
    with trio.fail_after(10):
        while service.bytes_received < 2 * len(publish) + 10:  # noqa: ASYNC110
            await trio.sleep(0.01)
    read = service.bytes_received

    async def publish_more():
        for _ in range(300):
            await stream.send_all(publish)

    nursery.start_soon(publish_more)
    await trio.sleep(1.5)  # a negative: the old trickle read 4 KiB every 0.1 s
    assert service.bytes_received == read
    mqtt_broker.set_alarm(ALARM, False)
    with trio.fail_after(10):
        while service.bytes_received < read + 300 * len(publish):  # noqa: ASYNC110
            await trio.sleep(0.01)
    await stream.aclose()
