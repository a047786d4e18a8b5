"""AMQP 1.0 with python-qpid-proton's client (BlockingConnection) against TrioMQ, served on
its AMQP port by protocol header as RabbitMQ 4 does, and across protocols with pika.

Where the machine's RabbitMQ answers AMQP 1.0 on 5672 (its ``rabbitmq_amqp1_0`` plugin)
the tests run against it too ([rabbitmq]), with the v1 addresses 3.10 knows (``/queue/Q``,
``/amq/queue/Q``, ``/exchange/X/KEY``); RabbitMQ 4's v2 addresses (``/queues/Q``,
``/exchanges/X/KEY``) are TrioMQ's only. Where 3.10 lacks a feature the [rabbitmq] case
skips with the reason."""
from __future__ import annotations

import socket
import uuid

import pika
import pytest
from brokerproc import BrokerProc
from proton import Delivery, Message, symbol
from proton.utils import BlockingConnection, LinkDetached, SendException

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0  # seconds a message may take on a loaded machine (a hang guard)
RABBIT_PORT = 5672


def _speaks_amqp10(port: int) -> bool:
    """True when the broker on ``port`` answers an AMQP 1.0 SASL header with its own."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(5)
            s.sendall(b"AMQP\x03\x01\x00\x00")
            return s.recv(8) == b"AMQP\x03\x01\x00\x00"
    except OSError:
        return False


class Target:
    def __init__(self, port: int, rabbit: bool):
        self.port = port
        self.rabbit = rabbit
        self.url = f"amqp://guest:guest@127.0.0.1:{port}"

    def connect(self, user: str = "guest", password: str = "guest", **kw) -> BlockingConnection:
        return BlockingConnection(f"amqp://{user}:{password}@127.0.0.1:{self.port}",
                                  timeout=WAIT, allowed_mechs="PLAIN", **kw)

    def pika(self, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, credentials=pika.PlainCredentials(user, password)))

    def v2(self) -> None:
        if self.rabbit:
            pytest.skip("RabbitMQ 3.10's AMQP 1.0 plugin has no v2 addresses (RabbitMQ 4's)")

    def queue(self, name: str) -> str:
        """An existing queue's address: v2 on TrioMQ; /amq/queue/ on 3.10, whose /queue/
        redeclares the queue without its arguments (and never answers the refused attach)."""
        return f"/amq/queue/{name}" if self.rabbit else f"/queues/{name}"

    def exchange(self, name: str, key: str | None = None) -> str:
        prefix = "/exchange/" if self.rabbit else "/exchanges/"
        return prefix + name + ("" if key is None else "/" + key)


@pytest.fixture(scope="module", params=["triomq", "rabbitmq"])
def target(request, tmp_path_factory):
    if request.param == "rabbitmq":
        if not _speaks_amqp10(RABBIT_PORT):
            pytest.skip("the machine's RabbitMQ does not serve AMQP 1.0 (rabbitmq_amqp1_0 off)")
        yield Target(RABBIT_PORT, True)
        return
    proc = BrokerProc(tmp_path_factory.mktemp("amqp10") / "data")
    proc.start()
    try:
        yield Target(proc.port, False)
    finally:
        proc.stop()


@pytest.fixture
def qname(target):
    name = "amqp10-" + uuid.uuid4().hex[:10]
    c = target.pika()
    # 3.10 redeclares /queue/NAME with the link terminus' durability (none by default, so
    # non-durable) and never answers an attach whose declare is refused as inequivalent
    c.channel().queue_declare(name, durable=not target.rabbit)
    c.close()
    yield name
    c = target.pika()
    c.channel().queue_delete(name)
    c.close()


def test_publish_and_consume_v2_queue_address(target, qname):
    target.v2()
    c = target.connect()
    try:
        snd = c.create_sender(f"/queues/{qname}")
        d = snd.send(Message(body="hello", properties={"a": 1}, durable=True, id=7))
        assert d.remote_state == Delivery.ACCEPTED
        rcv = c.create_receiver(f"/queues/{qname}", credit=10)
        m = rcv.receive(timeout=WAIT)
        assert m.body == "hello"  # an amqp-value string stays one, 1.0 to 1.0
        assert c.conn.remote_properties[symbol("product")] == "TrioMQ"
        assert m.properties == {"a": 1}
        assert m.id == 7 and m.durable
        rcv.accept()
    finally:
        c.close()


def test_v1_queue_address_declares_and_round_trips(target):
    name = "amqp10-v1-" + uuid.uuid4().hex[:8]
    c = target.connect()
    try:
        snd = c.create_sender(f"/queue/{name}")
        snd.send(Message(body=b"raw", inferred=True))
        rcv = c.create_receiver(f"/queue/{name}", credit=10)
        m = rcv.receive(timeout=WAIT)
        assert bytes(m.body) == b"raw"
        rcv.accept()
    finally:
        c.close()
        p = target.pika()
        p.channel().queue_delete(name)
        p.close()


def test_missing_queue_is_amqp_not_found(target):
    if target.rabbit:
        pytest.skip("3.10 attaches a sender to a missing /amq/queue/ and never answers a receiver")
    c = target.connect()
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_sender("/queues/no-such-queue-" + uuid.uuid4().hex[:6])
        assert info.value.condition == "amqp:not-found"
        assert "no queue" in str(info.value)
    finally:
        c.close()


def test_unroutable_is_released(target):
    if target.rabbit:
        pytest.skip("3.10 accepts an unroutable transfer")
    c = target.connect()
    try:
        snd = c.create_sender("/exchanges/amq.direct/nobody-" + uuid.uuid4().hex[:6])
        with pytest.raises(SendException) as info:
            snd.send(Message(body="lost"))
        assert info.value.state == Delivery.RELEASED
    finally:
        c.close()


def test_exchange_address_routes_with_key_and_subject(target, qname):
    p = target.pika()
    p.channel().queue_bind(qname, "amq.direct", routing_key=qname)
    c = target.connect()
    try:
        c.create_sender(target.exchange("amq.direct", qname)).send(Message(body="by key"))
        # the exchange's address alone: the routing key is the message's subject
        c.create_sender(target.exchange("amq.direct")).send(Message(body="by subject",
                                                                    subject=qname))
        expected = ["by key", "by subject"]
        if not target.rabbit:  # 3.10 never answers an attach with a null target
            # a null target: the message's "to" names it
            c.create_sender(None).send(Message(body="by to", address=f"/queues/{qname}"))
            expected.append("by to")
        rcv = c.create_receiver(target.queue(qname), credit=10)
        bodies = []
        for _ in expected:
            bodies.append(rcv.receive(timeout=WAIT).body)
            rcv.accept()
        assert bodies == expected
    finally:
        c.close()
        p.close()


def test_amqp10_to_pika_keeps_properties(target, qname):
    c = target.connect()
    try:
        snd = c.create_sender(f"/queue/{qname}")
        snd.send(Message(body=b"payload", inferred=True, durable=True,
                         properties={"k": "v", "n": 5}, content_type="text/plain",
                         correlation_id="corr-1", id="mid-1", reply_to=f"/queues/{qname}",
                         priority=7, ttl=60, group_id="g1",
                         annotations={symbol("x-opt-origin"): "qpid"}))
    finally:
        c.close()
    p = target.pika()
    try:
        ch = p.channel()
        method, props, body = ch.basic_get(qname, auto_ack=True)
        assert body == b"payload"
        assert props.delivery_mode == 2
        assert props.content_type == "text/plain"
        assert props.correlation_id == "corr-1"
        assert props.message_id == "mid-1"
        assert props.priority == 7
        assert props.expiration == "60000"
        if target.rabbit:
            # 3.10 keeps the 1.0 sections encoded in headers of its own, not as headers
            assert "x-amqp-1.0-app-properties" in props.headers
            return
        assert props.reply_to == qname
        assert props.headers["JMSXGroupID"] in (b"g1", "g1")
        assert props.headers["x-opt-origin"] in (b"qpid", "qpid")
        assert props.headers["k"] in (b"v", "v")
        assert props.headers["n"] == 5
    finally:
        p.close()


def test_pika_to_amqp10_keeps_properties(target, qname):
    p = target.pika()
    try:
        p.channel().basic_publish("", qname, b"from pika", pika.BasicProperties(
            headers={"h": "x", "n": 3}, message_id="m1", correlation_id="c1",
            delivery_mode=2, content_type="application/json", priority=3, timestamp=1700000000,
            reply_to="replies"))
    finally:
        p.close()
    c = target.connect()
    try:
        rcv = c.create_receiver(f"/queue/{qname}", credit=10)
        m = rcv.receive(timeout=WAIT)
        assert bytes(m.body) == b"from pika"
        assert m.id == "m1" and m.correlation_id == "c1"
        assert m.durable and m.priority == 3
        rcv.accept()
        if target.rabbit:
            # 3.10 maps neither headers, content-type nor timestamp to 1.0, and answers
            # reply-to with its v1 address
            assert m.reply_to == "/queue/replies"
            return
        assert m.content_type == "application/json"
        assert m.properties["h"] == "x" and m.properties["n"] == 3
        assert int(m.creation_time) == 1700000000
        assert m.reply_to == "/queues/replies"
        assert m.annotations[symbol("x-routing-key")] == qname
    finally:
        c.close()


def test_uuid_and_ulong_ids_survive_a_pika_hop(target, qname):
    """A message-id's AMQP 1.0 type is kept in x-message-id-type (RabbitMQ's rule) when the
    message passes through AMQP 0-9-1 properties."""
    if target.rabbit:
        pytest.skip("RabbitMQ 3.10 keeps ids its own way")
    mid = uuid.uuid4()
    c = target.connect()
    try:
        c.create_sender(f"/queues/{qname}").send(Message(body=b"x", inferred=True, id=mid,
                                                         correlation_id=12345))
    finally:
        c.close()
    p = target.pika()
    try:
        ch = p.channel()
        _m, props, body = ch.basic_get(qname, auto_ack=True)
        assert props.message_id == str(mid)
        assert props.headers["x-message-id-type"] in (b"uuid", "uuid")
        assert props.correlation_id == "12345"
        ch.basic_publish("", qname, body, props)  # back in, then out over AMQP 1.0
    finally:
        p.close()
    c = target.connect()
    try:
        rcv = c.create_receiver(f"/queues/{qname}", credit=1)
        m = rcv.receive(timeout=WAIT)
        assert m.id == mid
        assert m.correlation_id == 12345
        rcv.accept()
    finally:
        c.close()


def test_released_requeues_and_rejected_dead_letters(target):
    name = "amqp10-dl-" + uuid.uuid4().hex[:8]
    p = target.pika()
    ch = p.channel()
    ch.queue_declare(name + "-dlq")
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": name + "-dlq"})
    c = target.connect()
    try:
        c.create_sender(target.queue(name)).send(Message(body="m"))
        rcv = c.create_receiver(target.queue(name), credit=1)
        assert rcv.receive(timeout=WAIT).body == "m"
        if not target.rabbit:  # 3.10 requeues a released delivery but never sends it again
            rcv.release()  # back to the queue, redelivered
            m = rcv.receive(timeout=WAIT)
            assert m.body == "m" and m.delivery_count >= 1
        rcv.reject()  # dead-lettered
        dl = c.create_receiver(target.queue(name + "-dlq"), credit=1)
        dead = dl.receive(timeout=WAIT)  # held: a binary body is a view into the message
        if target.rabbit:  # 3.10 keeps the 1.0 sections through dead-lettering
            assert dead.body == "m"
        else:
            # dead-lettering rebuilds the message from its 0-9-1 form: the body is bytes now
            assert bytes(dead.body) == b"m"
        dl.accept()
    finally:
        c.close()
        ch.queue_delete(name)
        ch.queue_delete(name + "-dlq")
        p.close()


def test_large_message_across_transfer_frames(target, qname):
    body = bytes(range(256)) * 8192  # 2 MiB: many transfer frames each way
    c = target.connect()
    try:
        c.create_sender(f"/queue/{qname}").send(Message(body=body, inferred=True))
        rcv = c.create_receiver(f"/queue/{qname}", credit=1)
        m = rcv.receive(timeout=WAIT)
        assert bytes(m.body) == body
        rcv.accept()
    finally:
        c.close()


def test_over_max_message_size_detaches_the_link(tmp_path):
    proc = BrokerProc(tmp_path / "data", store="memory", extra=["--max-message-size", "100000"])
    proc.start()
    try:
        c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="PLAIN")
        try:
            snd = c.create_sender("/queue/big")
            with pytest.raises((LinkDetached, SendException)) as info:
                snd.send(Message(body=b"x" * 300000, inferred=True))
            if isinstance(info.value, LinkDetached):
                assert info.value.condition == "amqp:link:message-size-exceeded"
            # the connection is still usable
            c.create_sender("/queue/big", name="another").send(Message(body="small"))
        finally:
            c.close()
    finally:
        proc.stop()


def test_wrong_password_is_refused(target):
    with pytest.raises(Exception) as info:
        target.connect(password="wrong").close()
    assert "auth" in str(info.value).lower() or "unauthorized" in str(info.value).lower()


def test_permissions_as_for_amqp091(tmp_path):
    """A user allowed to read but not to write: the publishing link is refused with
    amqp:unauthorized-access, the consuming link works."""
    proc = BrokerProc(tmp_path / "data", store="memory", http=True)
    proc.start()
    try:
        import httpx
        api = httpx.Client(base_url=proc.http_url + "/api", auth=("guest", "guest"),
                           timeout=WAIT)
        api.put("/users/reader", json={"password": "pw", "tags": ""}).raise_for_status()
        api.put("/permissions/%2F/reader", json={"configure": "", "write": "",
                                                 "read": ".*"}).raise_for_status()
        p = pika.BlockingConnection(pika.URLParameters(proc.url))
        p.channel().queue_declare("guarded")
        p.close()
        c = BlockingConnection(f"amqp://reader:pw@127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="PLAIN")
        try:
            with pytest.raises(LinkDetached) as info:
                c.create_sender("/queues/guarded")
            assert info.value.condition == "amqp:unauthorized-access"
            c.create_receiver("/queues/guarded", credit=1)
        finally:
            c.close()
    finally:
        proc.stop()


def test_own_port_and_no_amqp10_on_amqp_port(tmp_path):
    from brokerproc import free_port
    port = free_port()
    proc = BrokerProc(tmp_path / "data", store="memory",
                      extra=["--amqp10-port", str(port), "--no-amqp10"], wait_ports=(port,))
    proc.start()
    try:
        assert not _speaks_amqp10(proc.port)  # 0-9-1 only there
        c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                               allowed_mechs="PLAIN")
        try:
            c.create_sender("/queue/own-port").send(Message(body="x"))
        finally:
            c.close()
    finally:
        proc.stop()


def test_message_groups_one_consumer_per_group(target):
    """x-message-groups: AMQP 1.0's group-id (JMSXGroupID over 0-9-1) keeps a group at one
    receiver (ActiveMQ's JMS message groups)."""
    if target.rabbit:
        pytest.skip("message groups are ActiveMQ's; RabbitMQ has none")
    name = "amqp10-groups-" + uuid.uuid4().hex[:8]
    p = target.pika()
    ch = p.channel()
    ch.queue_declare(name, arguments={"x-message-groups": True})
    c = target.connect()
    try:
        r1 = c.create_receiver(f"/queues/{name}", credit=50, name="r1")
        r2 = c.create_receiver(f"/queues/{name}", credit=50, name="r2")
        snd = c.create_sender(f"/queues/{name}")
        for i, group in enumerate("aabbab"):  # round robin would mix the groups up
            snd.send(Message(body=f"{group}{i}", group_id=group))
        # and one from pika, grouped by the header
        ch.basic_publish("", name, b"a6", pika.BasicProperties(headers={"JMSXGroupID": "a"}))
        c.wait(lambda: len(r1.fetcher.incoming) + len(r2.fetcher.incoming) == 7, timeout=WAIT)
        got = []
        for r in (r1, r2):
            bodies = []
            while r.fetcher.incoming:
                m = r.receive(timeout=WAIT)
                bodies.append(m.body if isinstance(m.body, str) else bytes(m.body).decode())
                r.accept()
            got.append(bodies)
        assert sorted(got) == [["a0", "a1", "a4", "a6"], ["b2", "b3", "b5"]]
    finally:
        c.close()
        ch.queue_delete(name)
        p.close()


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """A TrioMQ with STOMP and MQTT listeners too, for the cross-protocol tests."""
    from brokerproc import free_port
    stomp_port = free_port()
    proc = BrokerProc(tmp_path_factory.mktemp("amqp10-multi") / "data", store="memory",
                      mqtt=True, extra=["--stomp-port", str(stomp_port)],
                      wait_ports=(stomp_port,))
    proc.start()
    try:
        yield proc, stomp_port
    finally:
        proc.stop()


def test_amqp10_to_stomp_and_back_keeps_fields(multi):
    import queue as queuelib

    import stomp
    proc, stomp_port = multi
    name = "x-proto-" + uuid.uuid4().hex[:8]
    frames: queuelib.Queue = queuelib.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            frames.put(frame)

    sc = stomp.Connection12([("127.0.0.1", stomp_port)])
    sc.set_listener("l", Listener())
    sc.connect("guest", "guest", wait=True)
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        sc.subscribe(f"/queue/{name}", id="s1", ack="auto")
        c.create_sender(f"/queue/{name}").send(Message(
            body=b"over stomp", inferred=True, durable=True, correlation_id="c-1",
            content_type="text/plain", properties={"app": "v", "n": 3}))
        f = frames.get(timeout=WAIT)
        assert f.body == "over stomp"
        assert f.headers["correlation-id"] == "c-1"
        assert f.headers["content-type"] == "text/plain"
        assert f.headers["persistent"] == "true"
        assert f.headers["app"] == "v" and f.headers["n"] == "3"
        # and back: a STOMP SEND to a queue an AMQP 1.0 receiver reads
        sc.send(f"/queue/{name}-back", "from stomp", headers={"correlation-id": "c-2",
                                                             "persistent": "true",
                                                             "app": "w"})
        rcv = c.create_receiver(f"/queue/{name}-back", credit=1)
        m = rcv.receive(timeout=WAIT)
        assert bytes(m.body) == b"from stomp"
        assert m.correlation_id == "c-2" and m.durable
        assert m.properties["app"] == "w"
        rcv.accept()
    finally:
        c.close()
        sc.disconnect()


def test_amqp10_and_mqtt_through_amq_topic(multi):
    import queue as queuelib

    import paho.mqtt.client as mqtt
    proc, _ = multi
    got: queuelib.Queue = queuelib.Queue()
    subscribed: queuelib.Queue = queuelib.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="x-" + uuid.uuid4().hex[:6])
    client.on_message = lambda _c, _u, msg: got.put(msg)
    client.on_subscribe = lambda *a: subscribed.put(True)
    client.connect("127.0.0.1", proc.mqtt_port)
    client.loop_start()
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        client.subscribe("sensors/one", qos=1)
        subscribed.get(timeout=WAIT)
        # AMQP 1.0 -> MQTT: amq.topic with the MQTT topic's routing key
        c.create_sender("/exchanges/amq.topic/sensors.one").send(
            Message(body=b"21.5", inferred=True))
        assert got.get(timeout=WAIT).payload == b"21.5"
        # MQTT -> AMQP 1.0: a link consuming /topic/sensors.two (a queue of its own)
        rcv = c.create_receiver("/topic/sensors.two", credit=5)
        client.publish("sensors/two", b"19.0", qos=1).wait_for_publish(timeout=WAIT)
        m = rcv.receive(timeout=WAIT)
        assert bytes(m.body) == b"19.0"
        assert m.annotations[symbol("x-routing-key")] == "sensors.two"
        rcv.accept()
    finally:
        c.close()
        client.loop_stop()
        client.disconnect()


def test_management_api_lists_amqp10_connections(tmp_path):
    import httpx
    proc = BrokerProc(tmp_path / "data", store="memory", http=True)
    proc.start()
    try:
        c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="PLAIN")
        try:
            c.create_sender("/queue/listed").send(Message(body="x"))
            r = httpx.get(proc.http_url + "/api/connections", auth=("guest", "guest"),
                          timeout=WAIT)
            assert r.status_code == 200
            conns = [x for x in r.json() if x["protocol"] == "AMQP 1-0"]
            assert len(conns) == 1
            assert conns[0]["user"] == "guest" and conns[0]["vhost"] == "/"
            assert conns[0]["recv_oct"] > 0
        finally:
            c.close()
    finally:
        proc.stop()


def test_tls_own_port_and_sniffed_on_the_amqps_port(tmp_path):
    """--amqps10-port, and AMQP 1.0 on the 0-9-1 TLS port (--tls-port) by protocol header
    inside TLS, as RabbitMQ 4 serves 5671."""
    import subprocess

    from brokerproc import free_port
    from proton import SSLDomain
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    own, amqps = free_port(), free_port()
    proc = BrokerProc(tmp_path / "data", store="memory",
                      extra=["--amqps10-port", str(own), "--tls-port", str(amqps),
                             "--tls-cert", str(cert), "--tls-key", str(key)],
                      wait_ports=(own, amqps))
    proc.start()
    try:
        for port in (own, amqps):
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            domain.set_trusted_ca_db(str(cert))
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
            c = BlockingConnection(f"amqps://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                                   ssl_domain=domain, allowed_mechs="PLAIN")
            try:
                c.create_sender("/queue/tls").send(Message(body=f"over {port}"))
                rcv = c.create_receiver("/queue/tls", credit=1)
                assert rcv.receive(timeout=WAIT).body == f"over {port}"
                rcv.accept()
            finally:
                c.close()
    finally:
        proc.stop()


def test_delivery_delay_goes_to_the_scheduler(target, qname):
    """x-opt-delivery-delay (ActiveMQ Artemis' and Azure's annotation): the message is
    held by the scheduler and reaches the queue after the delay."""
    if target.rabbit:
        pytest.skip("RabbitMQ has no scheduled delivery over AMQP 1.0")
    c = target.connect()
    p = target.pika()
    try:
        c.create_sender(f"/queues/{qname}").send(Message(
            body="later", annotations={symbol("x-opt-delivery-delay"): 5000}))
        # held: not in the queue right after it was accepted (the delay is 5 s)
        assert p.channel().queue_declare(qname, passive=True).method.message_count == 0
        rcv = c.create_receiver(f"/queues/{qname}", credit=1)
        # the scheduler publishes it anew from its 0-9-1 form: the body is bytes now
        assert bytes(rcv.receive(timeout=WAIT + 5).body) == b"later"
        rcv.accept()
    finally:
        c.close()
        p.close()


def test_jms_selector_filter_on_a_receiver(target):
    """A receiver's source filter with a JMS selector (Qpid JMS / ActiveMQ) is the queue's
    x-filter: the consumer gets only what it selects, the rest stays."""
    if target.rabbit:
        pytest.skip("RabbitMQ 3.10's AMQP 1.0 plugin has no JMS selectors")
    from proton.reactor import Selector
    name = "amqp10-sel-" + uuid.uuid4().hex[:8]
    c = target.connect()
    p = target.pika()
    try:
        snd = c.create_sender(f"/queue/{name}")
        for color in ("blue", "red", "blue", "red"):
            snd.send(Message(body=color, properties={"color": color}))
        rcv = c.create_receiver(f"/queue/{name}", credit=10, options=Selector("color = 'red'"))
        for _ in range(2):
            assert rcv.receive(timeout=WAIT).properties["color"] == "red"
            rcv.accept()
        assert p.channel().queue_declare(name, passive=True).method.message_count == 2
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/queue/{name}", options=Selector("color = = 'x'"), name="bad")
        assert info.value.condition == "amqp:precondition-failed"
    finally:
        c.close()
        p.channel().queue_delete(name)
        p.close()


def test_overflow_reject_publish_is_rejected(target):
    if target.rabbit:
        pytest.skip("3.10 closes the connection on a publish the queue refuses")
    name = "amqp10-full-" + uuid.uuid4().hex[:8]
    p = target.pika()
    ch = p.channel()
    ch.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    c = target.connect()
    try:
        snd = c.create_sender(f"/queues/{name}")
        assert snd.send(Message(body="fits")).remote_state == Delivery.ACCEPTED
        with pytest.raises(SendException) as info:
            snd.send(Message(body="refused"))
        assert info.value.state == Delivery.REJECTED
    finally:
        c.close()
        ch.queue_delete(name)
        p.close()


def test_anonymous_only_when_configured(tmp_path):
    proc = BrokerProc(tmp_path / "data", store="memory",
                      extra=["--amqp10-anonymous-user", "guest"])
    proc.start()
    try:
        c = BlockingConnection(f"amqp://127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="ANONYMOUS")
        try:
            c.create_sender("/queue/anon").send(Message(body="x"))
        finally:
            c.close()
    finally:
        proc.stop()
    proc = BrokerProc(tmp_path / "data2", store="memory")
    proc.start()
    try:
        with pytest.raises(Exception) as info:
            BlockingConnection(f"amqp://127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="ANONYMOUS").close()
        assert "auth" in str(info.value).lower() or "sasl" in str(info.value).lower()
    finally:
        proc.stop()


def _raw_login(port: int) -> socket.socket:
    """A raw socket past SASL PLAIN (guest) and the AMQP header exchange."""
    import struct

    from proton import Data, Described, ulong
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    s.sendall(b"AMQP\x03\x01\x00\x00")
    d = Data()
    d.put_object(Described(ulong(0x41), [symbol("PLAIN"), b"\x00guest\x00guest"]))
    body = bytes(d.encode())
    s.sendall(struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body)
    got = b""
    while b"\x00\x53\x44" not in got:  # sasl-outcome
        chunk = s.recv(4096)
        assert chunk
        got += chunk
    return s


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x0c\x02\x00\x00\x00\xff\xff\xff\xff",  # a body that is no performative
    b"\x00\x00\x00\x10\x02\x00\x00\x00\x00\x53\x99\x45\x00\x00\x00\x00",  # unknown one
    b"\x7f\xff\xff\xff\x02\x00\x00\x00",  # a frame declared 2 GiB: refused, not awaited
])
def test_hostile_frames_close_that_connection_only(target, garbage):
    if target.rabbit:
        pytest.skip("TrioMQ's error conditions")
    s = _raw_login(target.port)
    try:
        s.sendall(b"AMQP\x00\x01\x00\x00" + garbage)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        assert got.startswith(b"AMQP\x00\x01\x00\x00")
        assert b"amqp:" in got  # the close frame says why
    finally:
        s.close()
    c = target.connect()  # the broker serves others as before
    try:
        c.create_sender("/queue/after-garbage").send(Message(body="fine"))
    finally:
        c.close()
