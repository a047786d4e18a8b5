"""$SYS topics (broker/listeners/mqtt_sys.py) against a whole broker without sockets: the
values follow sessions, subscriptions and publishes; a round publishes only what changed,
retained in memory, to '$SYS/...' filters only; the load averages are Mosquitto's; a
client's PUBLISH to $SYS is dropped."""
from __future__ import annotations

import math

import pytest

from broker.listeners.mqtt_session import MQTTService, MQTTSession
from broker.listeners.mqtt_sys import PREFIX, SysTopics
from broker.mqtt import codec as m
from broker.mqtt.codec import PacketReader, encode


@pytest.fixture
def service(broker):
    return MQTTService(broker)


class Client:
    def __init__(self, service, client_id, clean=True):
        self.session = MQTTSession(service, "127.0.0.1:40000", "127.0.0.1")
        self.reader = PacketReader()
        self.send(m.Connect(client_id, clean, 60))

    def send(self, *packets) -> list:
        self.session.data_received(b"".join(encode(p) for p in packets))
        return self.output()

    def output(self) -> list:
        return self.reader.feed(self.session.conn.data_to_send())

    def publishes(self) -> list:
        return [(p.topic, p.payload, p.retain) for p in self.output() if isinstance(p, m.Publish)]


def test_values_follow_sessions_subscriptions_and_publishes(service):
    sys_topics = SysTopics(service, 10.0)
    v = sys_topics.values()
    assert v[PREFIX + "clients/connected"] == "0"
    assert v[PREFIX + "version"].startswith("TrioMQ version ")
    assert v[PREFIX + "uptime"].endswith(" seconds")
    a, b = Client(service, "a"), Client(service, "b", clean=False)
    a.send(m.Subscribe(1, [("x/#", 1), ("y", 0)]))
    b.send(m.Subscribe(1, [("z", 1)]))
    for _ in range(3):
        b.send(m.Publish("x/1", b"12345", 0))
    a.output()
    v = sys_topics.values()
    assert v[PREFIX + "clients/connected"] == "2"
    assert v[PREFIX + "subscriptions/count"] == "3"
    assert v[PREFIX + "messages/received"] == "3"
    assert v[PREFIX + "messages/sent"] == "3"
    assert v[PREFIX + "publish/bytes/received"] == "15"
    assert v[PREFIX + "publish/bytes/sent"] == "15"
    b.session.connection_lost()  # a persistent session without its connection
    v = sys_topics.values()
    assert v[PREFIX + "clients/connected"] == "1"
    assert v[PREFIX + "clients/disconnected"] == "1"
    assert v[PREFIX + "clients/total"] == "2"
    assert v[PREFIX + "clients/maximum"] == "2"


def test_round_publishes_changes_retained_to_sys_filters_only(service):
    sys_topics = SysTopics(service, 10.0)
    store = service.broker.store
    saved: list = []
    save_meta = store.save_meta
    store.save_meta = lambda kind, key, value: (saved.append(kind), save_meta(kind, key, value))
    mon, wild = Client(service, "mon"), Client(service, "wild")
    mon.send(m.Subscribe(1, [("$SYS/broker/clients/connected", 0), ("$SYS/broker/version", 0)]))
    wild.send(m.Subscribe(1, [("#", 0), ("+/broker/#", 0), ("+/+/+", 0)]))
    sys_topics.publish_round()
    assert sorted(mon.publishes()) == [("$SYS/broker/clients/connected", b"2", False),
                                       ("$SYS/broker/version", sys_topics.values()[
                                           PREFIX + "version"].encode(), False)]
    assert wild.publishes() == []
    sys_topics.publish_round()
    assert mon.publishes() == []  # nothing changed
    Client(service, "third")
    sys_topics.publish_round()
    assert mon.publishes() == [("$SYS/broker/clients/connected", b"3", False)]
    late = Client(service, "late")
    got = late.send(m.Subscribe(1, [("$SYS/broker/version", 0), ("#", 0)]))
    retained = [(p.topic, p.retain) for p in got if isinstance(p, m.Publish)]
    assert retained == [("$SYS/broker/version", True)]
    assert service.retained.get("/", "$SYS/broker/version") is not None
    assert "mqtt_retained" not in saved  # retained in memory only


def test_load_averages_are_mosquittos(service):
    sys_topics = SysTopics(service, 10.0)
    sys_topics.values(now=100.0)  # the first round has no rate yet
    service.publish_received += 600
    v = sys_topics.values(now=110.0)  # 600 in 10 s: 3600 a minute
    rate = 3600.0
    for seconds, label in ((60, "1min"), (300, "5min"), (900, "15min")):
        expected = rate + math.exp(-10 / seconds) * (0 - rate)
        assert v[PREFIX + f"load/messages/received/{label}"] == f"{expected:.2f}"
    assert v[PREFIX + "load/bytes/received/1min"] == "0.00"


def test_client_publish_to_sys_is_acknowledged_and_dropped(service):
    sys_topics = SysTopics(service, 10.0)
    watcher = Client(service, "w")
    watcher.send(m.Subscribe(1, [("$SYS/#", 0)]))
    watcher.output()
    spoofer = Client(service, "s")
    got = spoofer.send(m.Publish("$SYS/broker/version", b"fake", 1, True, False, 5),
                       m.Publish("$SYS", b"fake", 0, True))
    assert got == [m.PacketId(m.PUBACK, 5)]
    assert watcher.publishes() == []
    assert service.retained.get("/", "$SYS/broker/version") is None
    sys_topics.publish_round()
    assert (PREFIX + "version", sys_topics.values()[PREFIX + "version"].encode(), False) in \
        watcher.publishes()


def test_sys_messages_expire_in_an_absent_persistent_session(broker, service, clock):
    """A persistent session subscribed to $SYS/# that stays away keeps at most a minute of
    rounds (the messages expire after 60 s, as Mosquitto's), not every round since."""
    sys_topics = SysTopics(service, 10.0)
    away = Client(service, "away", clean=False)
    away.send(m.Subscribe(1, [("$SYS/#", 1)]))
    away.session.connection_lost()
    queue = next(q for name, q in broker.vhosts["/"].queues.items() if "away" in name)
    sizes = []
    for _ in range(30):  # five minutes of rounds every 10 s
        Client(service, f"c{len(sizes)}")  # so that some values change every round
        sys_topics.publish_round()
        clock.advance(10.0)
        sizes.append(len(queue.ready))
    assert sizes[-1] < 7 * len(sys_topics.values())  # about six rounds' worth at most
    assert sizes[-1] <= sizes[10] + len(sys_topics.values())  # flat after the first minute
