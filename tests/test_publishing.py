"""The one publish path (broker/publishing.py): the same message published through every
protocol -- AMQP, MQTT, STOMP, Hermes, the management API -- and the broker's own ``$SYS``
status passes the same stages (the publish hooks, routing, enqueue) with the same outcome.

Before, Hermes, the management API and ``$SYS`` routed without the publish hooks: an
``x-delay`` published through the management API was routed at once, a Hermes publish was
never seen by the cluster's or the scheduler's hook.

The broker runs in-process with its real listeners (AMQP, MQTT, STOMP, HTTP); the clients
speak the protocols over sockets (raw frames, httpx)."""
from __future__ import annotations

import httpx
import pytest
import trio

from broker.amqp import spec
from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.message import Message
from broker.mqtt import codec as m
from broker.persistence import MemoryStore, open_store
from broker.publishing import ROUTED, TAKEN, Source
from broker.stomp.codec import Frame, FrameReader, encode

from .support import TrioClient

STOMP_CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


@pytest.fixture
async def every_protocol(nursery, tmp_path):
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0,
                           http_port=0, http_host="127.0.0.1", mqtt_port=0, stomp_port=0,
                           mqtt_sys_interval=3600),
                    MemoryStore())
    server = Server(broker)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    with trio.fail_after(10):
        await broker.http_server.started.wait()
        while "mqtt" not in broker.mqtt.ports or "stomp" not in broker.stomp.ports:  # noqa: ASYNC110
            await trio.sleep(0.01)
    broker.amqp_port = port
    yield broker
    await server.shutdown()


def _record_hook(broker) -> list:
    """A publish hook that takes nothing and records who published what."""
    seen: list = []

    def hook(origin, message, mandatory, seq) -> bool:
        if b"same" in message.body:
            seen.append((message.exchange, message.routing_key, message.body,
                         origin.vhost.name))
        return False

    broker.publishing.hooks.append(hook)
    return seen


async def _wait(predicate, what: str) -> None:
    with trio.fail_after(10):  # a hang guard only
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def _amqp(broker, exchange: str, key: str, body: bytes, **props) -> None:
    c = await TrioClient.connect(broker.amqp_port)
    await c.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await c.publish(1, body, exchange, key, **props)
    await c.call(1, spec.Channel.Close(200, "", 0, 0), spec.Channel.CloseOk)
    await c.stream.aclose()


async def _mqtt(broker, topic: str, body: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", broker.mqtt.ports["mqtt"])
    await stream.send_all(m.encode(m.Connect("pub", True, 30, "guest", b"guest")))
    reader = m.PacketReader(1 << 20)
    got: list = []
    with trio.fail_after(10):
        while not got:
            data = await stream.receive_some(65536)
            assert data, "closed"
            got += reader.feed(data)
    await stream.send_all(m.encode(m.Publish(topic, body, 1, packet_id=1)))
    with trio.fail_after(10):
        while len(got) < 2:  # the PUBACK: the publish was handled
            data = await stream.receive_some(65536)
            assert data, "closed"
            got += reader.feed(data)
    await stream.aclose()


async def _stomp(broker, destination: str, body: bytes, **headers) -> list[Frame]:
    stream = await trio.open_tcp_stream("127.0.0.1", broker.stomp.ports["stomp"])
    await stream.send_all(STOMP_CONNECT)
    reader = FrameReader(1 << 20)
    frames: list[Frame] = []
    with trio.fail_after(10):
        while len(frames) < 1:
            frames += reader.feed(await stream.receive_some(65536))
    await stream.send_all(encode(Frame("SEND", {"destination": destination, "receipt": "r",
                                               **headers}, body)))
    with trio.fail_after(10):
        while len(frames) < 2:  # the RECEIPT (or an ERROR)
            data = await stream.receive_some(65536)
            assert data, "closed"
            frames += reader.feed(data)
    await stream.aclose()
    return frames


def _http(broker) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{broker.http_server.port}",
                             auth=("guest", "guest"), timeout=10)


async def test_every_protocol_publishes_through_the_hooks_and_routes_alike(every_protocol):
    broker = every_protocol
    vhost = broker.vhosts["/"]
    seen = _record_hook(broker)
    q = vhost.declare_queue("same", None, arguments={})
    vhost.bind("amq.topic", q, "t.same", {})
    await _amqp(broker, "amq.topic", "t.same", b"same-amqp")
    await _mqtt(broker, "t/same", b"same-mqtt")
    await _stomp(broker, "/topic/t.same", b"same-stomp")
    async with _http(broker) as http:
        r = await http.post("/api/exchanges/%2F/amq.topic/publish", json={
            "routing_key": "t.same", "payload": "same-http", "payload_encoding": "string",
            "properties": {}})
        assert r.status_code == 200 and r.json() == {"routed": True}
        # Hermes: a topic is an exchange of its own; the same queue bound to it
        r = await http.post("/topics", json={"name": "t.same", "description": "d",
                                             "contentType": "JSON",
                                             "owner": {"source": "Plaintext", "id": "x"}})
        assert r.status_code == 201, r.text
        vhost.bind("t.same", q, "#", {})
        r = await http.post("/topics/t.same", content=b'"same-hermes"',
                            headers={"Content-Type": "application/json"})
        assert r.status_code in (201, 202), r.text
    await _wait(lambda: q.message_count >= 5, "five messages in the queue")
    bodies = sorted(body for _x, _k, body, _v in seen)
    assert bodies == [b'"same-hermes"', b"same-amqp", b"same-http", b"same-mqtt",
                      b"same-stomp"]
    assert all(v == "/" for *_rest, v in seen)
    assert q.message_count == 5
    # the broker's own status ($SYS) too, left out of the audit trail only
    broker.publishing.hooks.clear()
    broker.publishing.hooks.append(lambda o, msg, *_: seen.append(msg.routing_key) and False)
    broker.mqtt.sys_topics.publish_round()
    assert any(isinstance(k, str) and k.startswith("$SYS.") for k in seen)


async def test_x_delay_is_scheduled_whichever_protocol_published(every_protocol):
    """The issue's measurement: through the management API an x-delay was routed at once."""
    broker = every_protocol
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    q = vhost.declare_queue("later", None, arguments={})
    vhost.bind("later", q, "k", {})
    before = broker.scheduler.pending
    await _amqp(broker, "later", "k", b"amqp", headers={"x-delay": 60_000})
    frames = await _stomp(broker, "/exchange/later/k", b"stomp", **{"x-delay": "60000"})
    assert frames[-1].command == "RECEIPT"
    async with _http(broker) as http:
        r = await http.post("/api/exchanges/%2F/later/publish", json={
            "routing_key": "k", "payload": "http", "payload_encoding": "string",
            "properties": {"headers": {"x-delay": 60_000}}})
        assert r.status_code == 200 and r.json() == {"routed": True}
        # a hook's refusal is the API's 400, as the channel's 406 is AMQP's
        r = await http.post("/api/exchanges/%2F/later/publish", json={
            "routing_key": "k", "payload": "bad", "payload_encoding": "string",
            "properties": {"headers": {"x-delay": "soon"}}})
        assert r.status_code == 400, r.text
        assert "x-delay" in r.json()["reason"]
    await _wait(lambda: broker.scheduler.pending >= before + 3, "three scheduled")
    assert q.message_count == 0  # none routed at once


def test_a_source_publish_reports_its_outcome(broker):
    """The path's outcome, for callers that answer it themselves (HTTP)."""
    vhost = broker.vhosts["/"]
    vhost.declare_queue("q", None, arguments={})
    source = Source(vhost, "guest", "test")
    delayed = {"headers": {"AMQ_SCHEDULED_DELAY": 60_000}}
    routed = broker.publishing.publish(source, Message("", "q", b"", {}, b"x"))
    nowhere = broker.publishing.publish(source, Message("", "none", b"", {}, b"x"))
    taken = broker.publishing.publish(source, Message("", "q", encode_properties(delayed),
                                                      delayed, b"x"))
    assert (routed, nowhere, taken) == (ROUTED, "unroutable", TAKEN)
    assert vhost.queues["q"].message_count == 1


def test_an_origin_without_a_vhost_is_refused_before_any_stage(broker):
    """A protocol session's vhost is None until its login: the path says so at once (no
    hook, queue or counter sees the message) instead of failing inside a stage."""
    vhost = broker.vhosts["/"]
    vhost.declare_queue("q", None, arguments={})
    source = Source(vhost, "guest", "test")
    source.vhost = None  # as a session before its login
    with pytest.raises(RuntimeError, match="not logged in"):
        broker.publishing.publish(source, Message("", "q", b"", {}, b"x"))
    assert vhost.queues["q"].message_count == 0


async def _mqtt_acks(stream, reader, want: int) -> list:
    got: list = []
    with trio.fail_after(10):  # a hang guard only
        while len(got) < want:
            data = await stream.receive_some(65536)
            assert data, "closed"
            got += reader.feed(data)
    return got


async def test_a_qos1_publish_is_refused_like_a_confirmed_one_while_the_store_fails(
        nursery, tmp_path):
    """The store-refusal stage applies to every publisher that hears the outcome: an MQTT
    QoS 1 publish into a queue of a failing store gets no PUBACK and no queue holds it
    (before: it was enqueued, and delivered, without its PUBACK)."""
    data = tmp_path / "data"
    data.mkdir()
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(data), heartbeat=0,
                           memory_limit_bytes=1 << 50, disk_free_limit=0, mqtt_port=0),
                    open_store(f"sqlite:///{tmp_path}/store.db", str(data)))
    server = Server(broker)
    await nursery.start(server.serve, "127.0.0.1", 0)
    with trio.fail_after(10):
        while "mqtt" not in broker.mqtt.ports:  # noqa: ASYNC110
            await trio.sleep(0.01)
    vhost = broker.vhosts["/"]
    q = vhost.declare_queue("kept", None, durable=True, arguments={})
    vhost.bind("amq.topic", q, "t.kept", {})
    assert q.store is not None
    stream = await trio.open_tcp_stream("127.0.0.1", broker.mqtt.ports["mqtt"])
    reader = m.PacketReader(1 << 20)
    await stream.send_all(m.encode(m.Connect("pub", True, 30, "guest", b"guest")))
    await _mqtt_acks(stream, reader, 1)  # CONNACK
    broker.on_store_failure(broker.store, "database down (test)")
    await stream.send_all(m.encode(m.Publish("t/kept", b"refused", 1, packet_id=1)))
    await stream.send_all(m.encode(m.Publish("t/none", b"nowhere", 1, packet_id=2)))
    acks = await _mqtt_acks(stream, reader, 1)
    assert [a.packet_id for a in acks] == [2]  # PUBACKs go in order: 1 was not taken
    assert q.message_count == 0
    broker.on_store_recovered(broker.store)
    await stream.send_all(m.encode(m.Publish("t/kept", b"stored", 1, packet_id=3)))
    acks = await _mqtt_acks(stream, reader, 1)
    assert [a.packet_id for a in acks] == [3] and q.message_count == 1
    await stream.aclose()
    await server.shutdown()


def test_http_publishes_are_audited_as_amqp_ones_and_sys_is_not(tmp_path):
    """The audit stage for the sources without a connection: a management API publish and
    a Hermes publish are recorded as published by their user and HTTP peer, with the
    outcome an AMQP publish gets; the broker's own $SYS status is not recorded."""
    from broker.audit.events import PUBC, WIDTH
    from broker.config import AuditSettings
    from broker.management.api_entities import publish_message
    broker = Broker(Config(data_dir=str(tmp_path / "data"), mqtt_port=0, mqtt_sys_interval=3600,
                           audit=AuditSettings(dir=str(tmp_path / "trail"))), MemoryStore())
    vhost = broker.vhosts["/"]
    q = vhost.declare_queue("audited", None, arguments={})
    vhost.bind("amq.topic", q, "t.audited", {})
    assert publish_message(broker, vhost, "amq.topic", "t.audited", {"message_id": "http"},
                           b"x", "guest", "10.0.0.1")
    assert not publish_message(broker, vhost, "amq.topic", "t.none", {"message_id": "lost"},
                               b"x", "guest", "10.0.0.1")
    topic = broker.hermes.create_topic({"name": "t.hermes", "description": "d",
                                        "contentType": "JSON",
                                        "owner": {"source": "Plaintext", "id": "x"}})
    vhost.bind("t.hermes", q, "#", {})
    _mid, accepted, _durable = broker.hermes.publish_now(topic, b"{}", "application/json",
                                                         user="guest", peer="10.0.0.2")
    assert accepted
    broker.mqtt.sys_topics.publish_round()
    buf = broker.audit.buf
    events = [buf[i:i + WIDTH] for i in range(0, len(buf), WIDTH) if buf[i] == PUBC]
    seen = [(e[2][1:3], e[3], e[4], e[11]) for e in events]
    assert seen == [(("guest", "10.0.0.1"), "amq.topic", "t.audited", "routed"),
                    (("guest", "10.0.0.1"), "amq.topic", "t.none", "unroutable"),
                    (("guest", "10.0.0.2"), "t.hermes", "t.hermes", "routed")]
    assert q.message_count == 2


class _FailingStore:
    """A store whose writes the test fails and makes durable (``when_durable`` waits)."""

    name = "test-store"
    capabilities = frozenset()

    def __init__(self):
        self.waiting: list = []

    def when_durable(self, callback, on_failure=None) -> None:
        self.waiting.append(callback)

    def queue_op(self, queue, op, entry) -> None:
        pass

    def durable_now(self) -> None:
        callbacks, self.waiting = self.waiting, []
        for cb in callbacks:
            cb()


def test_an_at_least_once_dead_letter_is_refused_while_its_target_store_fails(broker, clock):
    """Dead letters re-enter routing through the path (hooks off): the store-refusal stage
    keeps an at-least-once dead letter in its quorum queue while the target's store fails
    and routes it again once the store recovered (before: enqueued into the failing
    store's queue at once)."""
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("dlx", "fanout")
    src = vhost.declare_queue("src", None, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "dlx",
        "x-overflow": "reject-publish", "x-dead-letter-strategy": "at-least-once"})
    target = vhost.declare_queue("dlq", None, durable=True, arguments={})
    vhost.bind("dlx", target, "", {})
    store = _FailingStore()
    target.store = store  # what attach_store does for a stored queue
    broker.on_store_failure(store, "disk gone (test)")
    props = {"delivery_mode": 2}
    src.enqueue(Message("", "src", encode_properties(props), props, b"dl"))
    src.reject(src.get(), None)
    assert target.message_count == 0  # refused: still in src, unsettled
    broker.on_store_recovered(store)
    clock.advance(2)  # the retry
    assert target.message_count == 1
    assert target.get().message.headers["x-death"][0]["reason"] == b"rejected"
    store.durable_now()  # the source entry leaves once the target's store has it
    clock.advance(60)
    assert target.message_count == 0 and src.message_count == 0


def test_a_dead_letter_passes_no_hook_and_is_audited_as_an_enqueue_only(tmp_path):
    """A dead letter is published by no client: the path runs without hooks (an x-delay
    it carries is not scheduled again) and records no publish; the audit trail has the
    source queue's dead_lettered and the target's own enqueue."""
    from broker.audit.events import ENQ, PUBC, WIDTH
    from broker.config import AuditSettings
    broker = Broker(Config(data_dir=str(tmp_path / "data"),
                           audit=AuditSettings(dir=str(tmp_path / "trail"))), MemoryStore())
    vhost = broker.vhosts["/"]
    seen = _record_hook(broker)
    vhost.declare_exchange("dlx", "fanout")
    src = vhost.declare_queue("src", None, arguments={
        "x-dead-letter-exchange": "dlx"})
    target = vhost.declare_queue("dlq", None, arguments={})
    vhost.bind("dlx", target, "", {})
    props = {"headers": {"x-delay": 60_000}, "message_id": "dl"}
    source = Source(vhost, "guest", "test")
    assert broker.publishing.publish(source, Message("", "src", encode_properties(props),
                                                     props, b"same")) == ROUTED
    src.reject(src.get(), None)
    assert target.message_count == 1  # routed at once: no hook saw the dead letter
    assert len(seen) == 1  # the client's publish only
    buf = broker.audit.buf
    events = [buf[i:i + WIDTH] for i in range(0, len(buf), WIDTH)]
    # the client's publish only; the dead letter is the target's own enqueue event
    assert [(e[3], e[4]) for e in events if e[0] == PUBC] == [("", "src")]
    assert [e[3] for e in events if e[0] == ENQ] == ["dlq"]


async def test_the_management_publish_is_refused_during_an_alarm(every_protocol):
    """An alarm stops AMQP, MQTT and STOMP publishers' reads and Hermes answers 503; the
    management API's publish now answers 503 naming the alarm too. The aliveness test,
    which RabbitMQ keeps working under an alarm, still passes."""
    broker = every_protocol
    vhost = broker.vhosts["/"]
    q = vhost.declare_queue("alarmed", None, arguments={})
    broker.set_alarm("disk", True)
    try:
        async with _http(broker) as http:
            r = await http.post("/api/exchanges/%2F/amq.default/publish", json={
                "routing_key": "alarmed", "payload": "x", "payload_encoding": "string",
                "properties": {}})
            assert r.status_code == 503, r.text
            assert "disk" in r.json()["reason"]
            r = await http.get("/api/aliveness-test/%2F")
            assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        broker.set_alarm("disk", False)
    assert q.message_count == 0
    async with _http(broker) as http:
        r = await http.post("/api/exchanges/%2F/amq.default/publish", json={
            "routing_key": "alarmed", "payload": "x", "payload_encoding": "string",
            "properties": {}})
        assert r.status_code == 200 and r.json() == {"routed": True}
    assert q.message_count == 1


def test_a_transactions_check_back_and_default_commit_are_published_by_the_broker(tmp_path,
                                                                                   clock):
    """A half message's check-backs and its default decision go through the path (hooks
    off) with the broker as their origin: the audit trail records them as published by the
    peer ``transactions`` (before: enqueued into the queues past the path, no publish)."""
    from broker.audit.events import PUBC, WIDTH
    from broker.config import AuditSettings
    broker = Broker(Config(data_dir=str(tmp_path / "data"),
                           audit=AuditSettings(dir=str(tmp_path / "trail"))), MemoryStore())
    broker.timers.now = clock
    clock.timers = broker.timers
    broker.transactions.clock = clock
    vhost = broker.vhosts["/"]
    orders = vhost.declare_queue("orders", None, arguments={})
    checks = vhost.declare_queue("checks", None, arguments={})
    props = {"message_id": "tx-1", "reply_to": "checks",
             "headers": {"x-transaction": "prepare", "x-transaction-timeout": 100,
                         "x-transaction-check-max": 1, "x-transaction-default": "commit"}}
    source = Source(vhost, "guest", "test")
    assert broker.publishing.publish(source, Message("", "orders", encode_properties(props),
                                                     props, b"order")) == TAKEN
    for _ in range(50):  # a check-back, then the default commit
        clock.advance(0.1)
    stats = broker.transactions.stats
    assert (stats["checks"], stats["committed"], orders.message_count) == (1, 1, 1)
    assert checks.message_count == 0  # the check-back expired (its expiration: the wait)
    buf = broker.audit.buf
    events = [buf[i:i + WIDTH] for i in range(0, len(buf), WIDTH) if buf[i] == PUBC]
    assert [(e[2][1:3], e[3], e[4], e[11]) for e in events] == [
        (("guest", "test"), "", "orders", "taken"),
        ((None, "transactions"), "", "checks", "routed"),
        ((None, "transactions"), "", "orders", "routed")]


def test_a_scheduled_firing_goes_through_the_path_and_is_audited_as_fired(tmp_path):
    """The scheduler's firing enters routing through the path (hooks off: the scheduler's
    own hook took the message when it was published) with the broker as its origin; the
    trail records it as ``fired`` (with its queues, before their enqueues), not as a
    publish (before: routed and enqueued past the path)."""
    from broker.audit.events import ENQ, FIRE, PUBC, WIDTH
    from broker.config import AuditSettings
    from broker.scheduler.core import Scheduler
    from broker.scheduler.spec import Schedule
    now = [1_000_000.0]
    broker = Broker(Config(data_dir=str(tmp_path / "data"),
                           audit=AuditSettings(dir=str(tmp_path / "trail"))), MemoryStore())
    scheduler = Scheduler(broker.services, clock=lambda: now[0])
    vhost = broker.vhosts["/"]
    q = vhost.declare_queue("later", None, arguments={})
    calls: list = []
    publish = broker.publishing.publish

    def spy(origin, message, *args, **kw):
        calls.append((origin.audit_ctx[1:3], message.routing_key, kw.get("hooks", True)))
        return publish(origin, message, *args, **kw)

    broker.publishing.publish = spy  # type: ignore[method-assign]
    props: dict = {"headers": {}}
    scheduler.schedule(vhost, Message("", "later", encode_properties(props), props, b"x"),
                       Schedule("amq", delay=10))
    now[0] += 1
    assert scheduler.run_due() == 1
    assert q.message_count == 1
    assert calls == [((None, "scheduler"), "later", False)]
    buf = broker.audit.buf
    kinds = [(buf[i], buf[i + 2]) for i in range(0, len(buf), WIDTH)
             if buf[i] in (PUBC, FIRE, ENQ) and (buf[i] != ENQ or buf[i + 3] == "later")]
    assert [k for k, _ in kinds] == [FIRE, ENQ]
