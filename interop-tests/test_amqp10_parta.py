"""AMQP 1.0 beyond links and transfers, with python-qpid-proton's client: SASL EXTERNAL
over TLS (the client certificate's CN is the user), transactions (a coordinator link:
declare, transactional transfers and dispositions, discharge with commit or rollback),
RabbitMQ 4's HTTP-over-AMQP management node on ``/management``, and JMS message groups.

RabbitMQ 3.10's ``rabbitmq_amqp1_0`` plugin takes part where it has the feature
(transactions); it has no management node and no TLS listener here, so those are
TrioMQ's only."""
from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import pika
import pytest
from brokerproc import BrokerProc, free_port
from proton import Message, SSLDomain
from proton.handlers import TransactionalClientHandler
from proton.reactor import Container
from proton.utils import BlockingConnection
from test_tls import _client_cert, _openssl

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0
RABBIT_PORT = 5672


# ---------------------------------------------------------------- SASL EXTERNAL
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki10")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3", "-subj",
             "/CN=TrioMQ test ca", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "3", "-extfile", "san.cnf",
             cwd=d)
    _client_cert(d, "client", "tls-user", "ca")
    _client_cert(d, "nobody", "no-such-user", "ca")
    return d


def _domain(pki, cert: str | None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    if cert:
        domain.set_credentials(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"), None)
    return domain


def test_sasl_external_maps_the_certificate_cn_to_a_user(pki, tmp_path):
    defs = {"users": [{"name": "tls-user", "password_hash": "", "tags": []}],
            "permissions": [{"user": "tls-user", "vhost": "/", "configure": ".*",
                             "write": ".*", "read": ".*"}]}
    (tmp_path / "defs.json").write_text(json.dumps(defs))
    own, amqps = free_port(), free_port()
    proc = BrokerProc(tmp_path / "data", store="memory", http=True, extra=[
        "--amqps10-port", str(own), "--tls-port", str(amqps),
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-ca", str(pki / "ca.pem"), "--load-definitions", str(tmp_path / "defs.json")],
        wait_ports=(own, amqps))
    proc.start()
    try:
        for port in (own, amqps):  # its own port, and sniffed on the 0-9-1 TLS port
            q = f"external-{port}"
            c = BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=WAIT,
                                   ssl_domain=_domain(pki, "client"), allowed_mechs="EXTERNAL")
            try:
                c.create_sender(f"/queue/{q}").send(Message(body="by certificate",
                                                            user_id=b"tls-user"))
                rcv = c.create_receiver(f"/queue/{q}", credit=1)
                m = rcv.receive(timeout=WAIT)
                assert m.body == "by certificate"
                assert m.user_id == b"tls-user"  # the login is the certificate's CN
                rcv.accept()
                conns = httpx.get(f"{proc.http_url}/api/connections", auth=("guest", "guest"),
                                  timeout=WAIT).json()
                assert [(x["user"], x["auth_mechanism"], x["ssl"]) for x in conns
                        if x["protocol"] == "AMQP 1-0"] == [("tls-user", "EXTERNAL", True)]
            finally:
                c.close()
        # a certificate whose CN is no user is refused
        with pytest.raises(Exception, match=r"(?i)auth|sasl|refused"):
            BlockingConnection(f"amqps://127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, "nobody"), allowed_mechs="EXTERNAL")
        # without a certificate EXTERNAL is not offered; PLAIN still works
        with pytest.raises(Exception, match=r"(?i)auth|sasl|mech"):
            BlockingConnection(f"amqps://127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, None), allowed_mechs="EXTERNAL")
        c = BlockingConnection(f"amqps://guest:guest@127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, None), allowed_mechs="PLAIN")
        c.close()
    finally:
        proc.stop()


# ---------------------------------------------------------------- transactions
def _speaks_amqp10(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(5)
            s.sendall(b"AMQP\x03\x01\x00\x00")
            return s.recv(8) == b"AMQP\x03\x01\x00\x00"
    except OSError:
        return False


@pytest.fixture(scope="module", params=["triomq", "rabbitmq"])
def port(request, tmp_path_factory):
    if request.param == "rabbitmq":
        if not _speaks_amqp10(RABBIT_PORT):
            pytest.skip("the machine's RabbitMQ does not serve AMQP 1.0 (rabbitmq_amqp1_0 off)")
        yield RABBIT_PORT
        return
    proc = BrokerProc(tmp_path_factory.mktemp("amqp10tx") / "data", store="memory")
    proc.start()
    try:
        yield proc.port
    finally:
        proc.stop()


@pytest.fixture
def queue(port):
    name = "amqp10-tx-" + uuid.uuid4().hex[:10]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    c.channel().queue_declare(name, durable=True)
    c.close()
    yield name
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    c.channel().queue_delete(name)
    c.close()


def _count(port: int, queue: str) -> int:
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        c.close()


def _wait_count(port: int, queue: str, n: int) -> int:
    deadline = time.monotonic() + WAIT
    while True:
        got = _count(port, queue)
        if got == n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


class _TxClient(TransactionalClientHandler):
    """Runs ``script`` (a generator of the steps below) with a transaction at hand:
    each ``yield`` waits for what the step asked (a transaction declared, sent messages
    settled, a discharge, received messages)."""

    def __init__(self, port: int, queue: str, script, receive: bool = False):
        super().__init__(prefetch=0, auto_accept=False)
        self.url = f"amqp://guest:guest@127.0.0.1:{port}"
        self.address = f"/amq/queue/{queue}"  # (an existing queue, on 3.10 too)
        self.script = script(self)
        self.receive = receive
        self.txn = None
        self.waiting: str | None = None
        self.settled = 0
        self.received: list = []
        self.outcomes: list[str] = []
        self.error: str | None = None

    def on_start(self, event):
        self.container = event.container
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN")
        self.sender = event.container.create_sender(self.conn, self.address)
        if self.receive:
            self.receiver = event.container.create_receiver(self.conn, self.address)
            self.receiver.flow(10)
        # a hang guard for the whole script (its steps poll with their own deadlines)
        self.timer = event.container.schedule(3 * WAIT, self)
        self._step()

    def on_timer_task(self, event):
        self.error = f"timed out waiting for {self.waiting}"
        self.conn.close()

    def _step(self):
        try:
            self.waiting = next(self.script)
        except StopIteration:
            self.waiting = None
            self.timer.cancel()
            self.conn.close()

    def declare(self):
        self.container.declare_transaction(self.conn, handler=self)
        return "declared"

    def on_transaction_declared(self, event):
        self.txn = event.transaction
        if self.waiting == "declared":
            self._step()

    def on_transaction_committed(self, event):
        self.outcomes.append("committed")
        self._step()

    def on_transaction_aborted(self, event):
        self.outcomes.append("aborted")
        self._step()

    def on_transaction_commit_failed(self, event):
        self.outcomes.append("commit failed")
        self._step()

    def on_settled(self, event):
        if event.link.name == self.sender.name:
            self.settled += 1
            if self.waiting == "settled" and self.settled == self.expect:
                self._step()

    def send(self, *bodies: str):
        self.settled, self.expect = 0, len(bodies)
        for body in bodies:
            self.txn.send(self.sender, Message(body=body, durable=True))
        return "settled"

    def on_message(self, event):
        self.received.append(event.delivery)
        if self.waiting == "received" and len(self.received) == self.expect:
            self._step()

    def wait_received(self, n: int):
        self.expect = n
        if len(self.received) >= n:
            return None  # (the caller yields again at once)
        return "received"


def _no_rabbit_transactions(port: int) -> None:
    if port == RABBIT_PORT:
        # its coordinator link is detached with "Transactions not supported"
        pytest.skip("RabbitMQ 3.10's rabbitmq_amqp1_0 plugin has no transactions")


def _run(client: _TxClient) -> _TxClient:
    Container(client).run()
    assert client.error is None, client.error
    return client


def test_transaction_rollback_never_routes_commit_routes(port, queue):
    _no_rabbit_transactions(port)
    seen = {}

    def script(c):
        yield c.declare()
        yield c.send("r1", "r2")
        seen["held"] = _count(port, queue)  # a transactional transfer is not routed yet
        c.txn.abort()
        yield "discharged"
        seen["after abort"] = _count(port, queue)
        yield c.declare()
        yield c.send("c1", "c2", "c3")
        seen["before commit"] = _count(port, queue)
        c.txn.commit()
        yield "discharged"
        seen["after commit"] = _wait_count(port, queue, 3)

    client = _run(_TxClient(port, queue, script))
    assert client.outcomes == ["aborted", "committed"]
    assert seen == {"held": 0, "after abort": 0, "before commit": 0, "after commit": 3}
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        rcv = c.create_receiver(f"/amq/queue/{queue}", credit=10)
        bodies = []
        for _ in range(3):
            bodies.append(rcv.receive(timeout=WAIT).body)
            rcv.accept()
        assert bodies == ["c1", "c2", "c3"]  # in order, the rolled-back ones never
    finally:
        c.close()


def test_transactional_acks_apply_at_commit_only(port, queue):
    _no_rabbit_transactions(port)
    p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = p.channel()
    for i in range(4):
        ch.basic_publish("", queue, f"m{i}".encode())
    p.close()
    assert _wait_count(port, queue, 4) == 4

    def script(c):
        yield c.declare()
        if c.wait_received(4):
            yield "received"
        for d in c.received[:2]:
            c.txn.accept(d)  # held: the broker acks them at commit
        c.txn.abort()
        yield "discharged"
        yield c.declare()
        for d in c.received[2:]:
            c.txn.accept(d)
        c.txn.commit()
        yield "discharged"

    client = _run(_TxClient(port, queue, script, receive=True))
    assert client.outcomes == ["aborted", "committed"]
    # the aborted acks were not applied: m0 and m1 come back once the connection is gone
    # (proton's client releases them after the abort); m2 and m3 were acked
    assert _wait_count(port, queue, 2) == 2
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        rcv = c.create_receiver(f"/amq/queue/{queue}", credit=10)
        got = []
        for _ in range(2):
            m = rcv.receive(timeout=WAIT)  # (its body is a view of the message's memory)
            got.append(bytes(m.body).decode())
            rcv.accept()
        got.sort()
        assert got == ["m0", "m1"]
    finally:
        c.close()


def test_open_transaction_rolls_back_when_the_connection_closes(port, queue):
    _no_rabbit_transactions(port)

    def script(c):
        yield c.declare()
        yield c.send("never", "routed")  # then the connection closes, undischarged

    _run(_TxClient(port, queue, script))
    p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = p.channel()
    ch.basic_publish("", queue, b"marker")  # after the close: the only message there
    p.close()
    assert _wait_count(port, queue, 1) == 1


# ---------------------------------------------------------------- management node
def _no_rabbit_management(port: int) -> None:
    if port == RABBIT_PORT:
        pytest.skip("RabbitMQ 3.10 has no HTTP-over-AMQP management node (RabbitMQ 4's)")


class _Mgmt:
    """A management link pair with qpid-proton's BlockingConnection, as RabbitMQ 4's
    clients attach it (both links named alike, requests and answers settled)."""

    def __init__(self, port: int):
        from proton import symbol
        self.conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                                       allowed_mechs="PLAIN")
        self.sender = self.conn.create_sender("/management", name="management-link-pair")
        self.receiver = self.conn.create_receiver("/management", name="management-link-pair",
                                                  credit=10)
        self.paired = symbol("paired")

    def request(self, method: str, path: str, body=None) -> tuple[int, object]:
        mid = str(uuid.uuid4())
        self.sender.send(Message(id=mid, address=path, subject=method, reply_to="$me", body=body,
                                 inferred=False))
        m = self.receiver.receive(timeout=WAIT)  # (settled by the broker)
        assert m.correlation_id == mid
        assert m.properties == {"http:response": "1.1"}
        return int(m.subject), m.body

    def close(self):
        self.conn.close()


def test_management_node_queues_exchanges_bindings(port):
    _no_rabbit_management(port)
    q, x = "mgmt-q-" + uuid.uuid4().hex[:6], "mgmt x/" + uuid.uuid4().hex[:6]
    qp, xp = f"/queues/{q}", "/exchanges/" + x.replace(" ", "%20").replace("/", "%2F")
    m = _Mgmt(port)
    try:
        status, info = m.request("PUT", qp, {"durable": True, "exclusive": False,
                                             "auto_delete": False,
                                             "arguments": {"x-max-length": 10}})
        assert status == 201
        assert info["name"] == q and info["durable"] and info["type"] == "classic"
        assert info["arguments"] == {"x-max-length": 10} and info["message_count"] == 0
        assert m.request("PUT", qp, {"durable": True, "arguments": {"x-max-length": 10}})[0] \
            == 200
        status, text = m.request("PUT", qp, {"durable": False})
        assert status == 409 and "durable" in text  # inequivalent, RabbitMQ's text
        assert m.request("PUT", xp, {"type": "topic", "durable": True})[0] == 204
        assert m.request("PUT", xp, {"type": "fanout"})[0] == 409
        assert m.request("POST", "/bindings", {"source": x, "destination_queue": q,
                                               "binding_key": "a.*", "arguments": {}})[0] == 204
        query = f"/bindings?src={x.replace(' ', '%20').replace('/', '%2F')}&dstq={q}&key=a.*"
        status, found = m.request("GET", query)
        assert status == 200 and len(found) == 1
        location = found[0]["location"]
        assert found[0]["binding_key"] == "a.*" and found[0]["destination_queue"] == q

        p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = p.channel()
        ch.confirm_delivery()
        ch.basic_publish(x, "a.b", b"routed by the binding")
        ch.basic_publish(x, "b.b", b"not")
        p.close()
        assert m.request("GET", qp)[1]["message_count"] == 1
        assert m.request("DELETE", f"{qp}/messages") == (200, {"message_count": 1})
        assert m.request("DELETE", location)[0] == 204
        assert m.request("GET", query) == (200, [])
        # an exchange-to-exchange binding: amq.fanout -> x -> q
        assert m.request("POST", "/bindings", {"source": x, "destination_queue": q,
                                               "binding_key": "e2e"})[0] == 204
        assert m.request("POST", "/bindings", {"source": "amq.fanout",
                                               "destination_exchange": x,
                                               "binding_key": "e2e"})[0] == 204
        p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = p.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.fanout", "e2e", b"through two exchanges")
        p.close()
        assert m.request("GET", qp)[1]["message_count"] == 1
        xq = x.replace(" ", "%20").replace("/", "%2F")
        status, found = m.request("GET", f"/bindings?src=amq.fanout&dste={xq}&key=e2e")
        assert status == 200 and [b["destination_exchange"] for b in found] == [x]
        assert m.request("DELETE", found[0]["location"])[0] == 204
        assert m.request("GET", f"/bindings?src=amq.fanout&dste={xq}&key=e2e") == (200, [])
        assert m.request("DELETE", qp) == (200, {"message_count": 1})
        assert m.request("GET", qp)[0] == 404
        assert m.request("DELETE", xp)[0] == 204
        # RabbitMQ's refusals
        assert m.request("PUT", "/queues/amq.mine", {})[0] == 403
        assert m.request("DELETE", "/exchanges/amq.direct")[0] == 403
        assert m.request("PUT", "/queues/", {})[0] == 400
        assert m.request("POST", "/bindings", {"source": "no-such", "destination_queue": q,
                                               "binding_key": ""})[0] == 404
        assert m.request("PATCH", qp)[0] == 400
    finally:
        m.close()


def test_management_node_answers_with_0_9_1_arguments(port):
    """A queue declared over 0-9-1 with a decimal and a timestamp argument, and a binding
    with a decimal, read back through the management node: the answer arrives (proton's
    encoder refused both types and the client's connection was aborted) and the connection
    goes on."""
    import datetime
    import decimal
    _no_rabbit_management(port)
    q = "mgmt-args-" + uuid.uuid4().hex[:6]
    when = datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)
    p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = p.channel()
        ch.queue_declare(q, arguments={"x-d": decimal.Decimal("1.5"), "x-t": when})
        ch.queue_bind(q, "amq.direct", q, arguments={"x-d": decimal.Decimal("2.5")})
    finally:
        p.close()
    m = _Mgmt(port)
    try:
        status, info = m.request("GET", f"/queues/{q}")
        assert status == 200 and info["arguments"]["x-d"] == "1.5"
        assert int(info["arguments"]["x-t"]) == int(when.timestamp() * 1000)
        status, found = m.request("GET", f"/bindings?src=amq.direct&dstq={q}&key={q}")
        assert status == 200 and found[0]["arguments"] == {"x-d": "2.5"}
        assert m.request("DELETE", f"/queues/{q}") == (200, {"message_count": 0})
    finally:
        m.close()


def test_management_node_refuses_without_permission(tmp_path):
    defs = {"users": [{"name": "reader", "password": "pw", "tags": []}],
            "permissions": [{"user": "reader", "vhost": "/", "configure": "^$",
                             "write": "^$", "read": ".*"}]}
    (tmp_path / "defs.json").write_text(json.dumps(defs))
    proc = BrokerProc(tmp_path / "data", store="memory",
                      extra=["--load-definitions", str(tmp_path / "defs.json")])
    proc.start()
    try:
        conn = BlockingConnection(f"amqp://reader:pw@127.0.0.1:{proc.port}", timeout=WAIT,
                                  allowed_mechs="PLAIN")
        snd = conn.create_sender("/management", name="pair")
        rcv = conn.create_receiver("/management", name="pair", credit=5)
        snd.send(Message(id="1", address="/queues/forbidden", subject="PUT", reply_to="$me",
                         body={}, inferred=False))
        m = rcv.receive(timeout=WAIT)
        assert m.subject == "403" and "refused for user 'reader'" in m.body
        conn.close()
    finally:
        proc.stop()


def test_rabbitmq_amqp_python_client_management(port):
    """RabbitMQ 4's own AMQP 1.0 client's Management, on the connection it would use
    (its Connection refuses a server whose product is not RabbitMQ 4, so the blocking
    connection is made as it makes it)."""
    _no_rabbit_management(port)
    rmq = pytest.importorskip("rabbitmq_amqp_python_client")
    from rabbitmq_amqp_python_client.qpid.proton.utils import (
        BlockingConnection as RmqBlockingConnection,
    )
    q, x = "rmq-client-q-" + uuid.uuid4().hex[:6], "rmq-client-x-" + uuid.uuid4().hex[:6]
    conn = RmqBlockingConnection(url=f"amqp://guest:guest@127.0.0.1:{port}",
                                 allowed_mechs="PLAIN")
    mgmt = rmq.Management(conn)
    mgmt.open()
    try:
        mgmt.declare_exchange(rmq.ExchangeSpecification(name=x,
                                                        exchange_type=rmq.ExchangeType.direct))
        mgmt.declare_queue(rmq.ClassicQueueSpecification(name=q, max_len=100))
        path = mgmt.bind(rmq.ExchangeToQueueBindingSpecification(
            source_exchange=x, destination_queue=q, binding_key="k"))
        p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = p.channel()
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish(x, "k", b"via the client's binding")
        p.close()
        info = mgmt.queue_info(q)
        assert info.message_count == 3 and info.is_durable and info.arguments["x-max-length"] == 100
        with pytest.raises(rmq.ValidationCodeException):  # 409: not equivalent
            mgmt.declare_queue(rmq.ClassicQueueSpecification(name=q, is_durable=False))
        assert mgmt.purge_queue(q) == 3
        mgmt.unbind(path)
        mgmt.delete_queue(q)
        mgmt.delete_exchange(x)
        with pytest.raises(rmq.ValidationCodeException):
            mgmt.queue_info(q)
    finally:
        mgmt.close()
        conn.close()


# ---------------------------------------------------------------- message groups
def _receive_all(c, receivers, n: int) -> list[list[str]]:
    c.wait(lambda: sum(len(r.fetcher.incoming) for r in receivers) == n, timeout=WAIT)
    got = []
    for r in receivers:
        bodies = []
        while r.fetcher.incoming:
            m = r.receive(timeout=WAIT)
            bodies.append(m.body if isinstance(m.body, str) else bytes(m.body).decode())
            r.accept()
        got.append(bodies)
    return got


def test_group_id_alone_does_not_group_as_on_rabbitmq(port, queue):
    """The default is RabbitMQ's: a group-id (JMSXGroupID) on a queue that was not asked
    to group changes nothing, the receivers take turns."""
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        r1 = c.create_receiver(f"/amq/queue/{queue}", credit=50, name="r1")
        r2 = c.create_receiver(f"/amq/queue/{queue}", credit=50, name="r2")
        snd = c.create_sender(f"/amq/queue/{queue}")
        for i in range(4):
            snd.send(Message(body=f"a{i}", group_id="a"))
        got = _receive_all(c, (r1, r2), 4)
        assert sorted(got) == [["a0", "a2"], ["a1", "a3"]]
    finally:
        c.close()


def test_message_groups_by_policy_with_amqp10_receivers(tmp_path):
    """ActiveMQ's behaviour on demand: a message-groups policy groups a queue declared
    without x-message-groups (TrioMQ's own policy key: RabbitMQ has no groups)."""
    proc = BrokerProc(tmp_path / "data", store="memory", http=True)
    proc.start()
    try:
        p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))
        p.channel().queue_declare("jms.orders")
        p.close()
        r = httpx.put(f"{proc.http_url}/api/policies/%2F/jms-groups", auth=("guest", "guest"),
                      json={"pattern": "^jms\\.", "apply-to": "queues",
                            "definition": {"message-groups": True}}, timeout=WAIT)
        assert r.status_code in (201, 204), r.text
        c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}", timeout=WAIT,
                               allowed_mechs="PLAIN")
        try:
            r1 = c.create_receiver("/queues/jms.orders", credit=50, name="r1")
            r2 = c.create_receiver("/queues/jms.orders", credit=50, name="r2")
            snd = c.create_sender("/queues/jms.orders")
            for i, group in enumerate("aabbab"):
                snd.send(Message(body=f"{group}{i}", group_id=group))
            got = _receive_all(c, (r1, r2), 6)
            assert sorted(got) == [["a0", "a1", "a4"], ["b2", "b3", "b5"]]
        finally:
            c.close()
    finally:
        proc.stop()


def test_unknown_transaction_id_fails_the_discharge(port, queue):
    _no_rabbit_transactions(port)

    def script(c):
        yield c.declare()
        c.txn.commit()
        yield "discharged"
        c.txn.commit()  # the same id again: no such transaction any more
        yield "discharged"

    client = _run(_TxClient(port, queue, script))
    assert client.outcomes == ["committed", "commit failed"]


def test_committed_persistent_messages_survive_a_kill(tmp_path):
    """The discharge is accepted once the store has the transaction's persistent messages
    in a durable queue (as a commit-ok): a kill -9 right after keeps them."""
    proc = BrokerProc(tmp_path / "data")  # the default, persistent store
    proc.start()
    try:
        p = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))
        p.channel().queue_declare("tx-durable", durable=True)
        p.close()

        def script(c):
            yield c.declare()
            yield c.send("d1", "d2")
            c.txn.commit()
            yield "discharged"

        client = _run(_TxClient(proc.port, "tx-durable", script))
        assert client.outcomes == ["committed"]
        proc.restart(hard=True)
        assert _wait_count(proc.port, "tx-durable", 2) == 2
    finally:
        proc.stop()


def test_request_on_an_unpaired_management_link_is_rejected(port):
    _no_rabbit_management(port)
    from proton import Delivery
    from proton.utils import SendException
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=WAIT,
                           allowed_mechs="PLAIN")
    try:
        snd = c.create_sender("/management", name="no-pair")
        with pytest.raises(SendException) as info:
            snd.send(Message(id="1", address="/queues/x", subject="GET", reply_to="$me",
                             inferred=False))
        assert info.value.state == Delivery.REJECTED
        snd.close()
        # the connection stays
        c.create_sender("/management", name="pair")
        rcv = c.create_receiver("/management", name="pair", credit=1)
        assert rcv is not None
    finally:
        c.close()
