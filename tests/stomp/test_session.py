"""The STOMP session against a whole broker (memory store, fake clock), without sockets:
login and vhosts, permissions, transactions, the AMQP side of the mapping."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.listeners.stomp_session import StompService, StompSession
from broker.stomp.codec import Frame, FrameReader, encode

from ..support import declare_queue


@pytest.fixture
def service(broker):
    return StompService(broker)


class Client:
    def __init__(self, service, login="guest", passcode="guest", host="/", version="1.2",
                 connect: dict | None = None):
        self.session = StompSession(service, "127.0.0.1:40000", "127.0.0.1")
        self.reader = FrameReader(1 << 20)
        self.reader.version = version
        headers = {"accept-version": version, "login": login, "passcode": passcode}
        if host is not None:
            headers["host"] = host
        headers.update(connect or {})
        self.connected = self.send("CONNECT", **headers)

    def send(self, command, body=b"", h: dict | None = None, **headers) -> list[Frame]:
        headers = {k.replace("_", "-"): v for k, v in headers.items()}
        headers.update(h or {})
        self.session.data_received(encode(Frame(command, headers, body)))
        return self.reader.feed(self.session.conn.data_to_send())


def test_login_vhost_and_permissions(broker, service):
    access = broker.access
    access.add_vhost("shop")
    access.add_user("app", "pw")
    access.set_permissions("app", "shop", "^app-", "^(amq\\.topic|app-.*)$", "^app-")
    (err,) = Client(service, "app", "nope", "shop").connected
    assert (err.command, err.headers["message"]) == ("ERROR", "Bad CONNECT")
    assert err.body == b"Access refused for user 'app'\n"
    (err,) = Client(service, "app", "pw", "/").connected  # no permissions in '/'
    assert err.body == b"Virtual host '/' access denied"
    c = Client(service, "app", "pw", "shop")
    assert c.connected[0].command == "CONNECTED"
    assert c.session.vhost.name == "shop"
    assert c.send("SUBSCRIBE", destination="/queue/app-q", id="1", receipt="r")[0].command \
        == "RECEIPT"
    (err,) = c.send("SEND", b"x", destination="/queue/other", receipt="r2")
    assert err.headers["message"] == "access_refused"
    assert err.body.startswith(b"ACCESS_REFUSED - access to queue 'other' in vhost 'shop'")
    assert c.session.finished


def test_host_header_that_names_a_host_means_the_default_vhost(broker, service):
    assert Client(service, host="127.0.0.1").connected[0].command == "CONNECTED"
    assert Client(service, host="localhost").connected[0].command == "CONNECTED"
    (err,) = Client(service, host="nope").connected
    assert err.body == b"Virtual host 'nope' access denied"


def test_begin_again_restarts_the_transaction(broker, service):
    q = declare_queue(broker.vhosts["/"], "txq")
    c = Client(service)
    c.send("BEGIN", transaction="t")
    c.send("SEND", b"one", destination="/amq/queue/txq", transaction="t")
    c.send("BEGIN", transaction="t")  # as RabbitMQ's plugin: "one" is dropped
    c.send("SEND", b"two", destination="/amq/queue/txq", transaction="t")
    assert q.message_count == 0
    assert c.send("COMMIT", transaction="t", receipt="c")[0].headers["receipt-id"] == "c"
    assert [e.message.body for e in q.ready] == [b"two"]


def test_disconnect_requeues_and_temp_queues_go(broker, service):
    vhost = broker.vhosts["/"]
    c = Client(service)
    c.send("SEND", b"m", destination="/queue/work", reply_to="/temp-queue/r")
    temp = c.session.temp_queues["r"]
    (msg,) = c.send("SUBSCRIBE", destination="/queue/work", id="s", ack="client")
    assert msg.headers["reply-to"] == "/reply-queue/" + temp.name
    assert vhost.queues["work"].unacked_count == 1
    c.send("DISCONNECT", receipt="bye")
    assert temp.name not in vhost.queues
    q = vhost.queues["work"]
    assert [e.redelivered for e in q.ready] == [True] and not q.consumers
    assert c.session not in broker.sessions


def test_queue_deleted_under_a_subscription_is_told_and_the_connection_stays(broker, service):
    c = Client(service)
    c.send("SUBSCRIBE", destination="/queue/gone", id="s")
    broker.vhosts["/"].delete_queue(broker.vhosts["/"].queues["gone"])
    (err,) = c.reader.feed(c.session.conn.data_to_send())
    assert err.headers == {"message": "Server cancelled subscription",
                           "content-type": "text/plain", "version": "1.0,1.1,1.2",
                           "subscription": "s", "content-length": "89"}
    assert err.body == (b"The server has canceled a subscription.\n"
                        b"No more messages will be delivered for \"id='s'\".\n")
    assert not c.session.finished  # as RabbitMQ's plugin: a notice, not the end
    assert c.send("SEND", b"x", destination="/queue/q", receipt="r")[0].command == "RECEIPT"


def test_unsubscribe_leaves_deliveries_to_acknowledge(broker, service):
    c = Client(service)
    (msg,) = c.send("SEND", b"x", destination="/queue/u") or c.send(
        "SUBSCRIBE", destination="/queue/u", id="s", ack="client-individual")
    c.send("UNSUBSCRIBE", id="s")
    assert c.send("ACK", id=msg.headers["ack"], receipt="r")[0].command == "RECEIPT"
    assert broker.vhosts["/"].queues["u"].message_count == 0


def test_activemq_numeric_scheduling_headers_reach_the_scheduler(broker, service):
    c = Client(service)
    c.send("SUBSCRIBE", destination="/queue/later", id="s")
    assert c.send("SEND", b"x", destination="/queue/later",
                  h={"AMQ_SCHEDULED_DELAY": "5000"}) == []
    assert broker.vhosts["/"].queues["later"].message_count == 0  # held by the scheduler
    (err,) = c.send("SEND", b"x", destination="/queue/later",
                      h={"AMQ_SCHEDULED_DELAY": "soon"})
    assert err.headers["message"] == "precondition_failed"


def test_listed_with_the_other_connections(broker, service):
    from broker.management.api_connections import connection_json
    c = Client(service, version="1.1")
    assert c.session in broker.sessions
    info = connection_json(c.session)
    assert (info["protocol"], info["user"], info["vhost"]) == ("STOMP 1.1", "guest", "/")
    c.send("DISCONNECT")
    assert c.session not in broker.sessions


_commands = st.sampled_from(["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN",
                             "COMMIT", "ABORT", "DISCONNECT", "CONNECT", "FOO"])
_keys = st.sampled_from(["destination", "id", "ack", "transaction", "receipt", "reply-to",
                         "persistent", "durable", "selector", "prefetch-count", "requeue",
                         "priority", "x-max-length", "AMQ_SCHEDULED_DELAY", "message-id",
                         "activemq.subscriptionName", "user-id", "expiration"])
_values = st.sampled_from(["/queue/a", "/topic/a.*", "/exchange/amq.direct/k", "/temp-queue/t",
                           "/amq/queue/a", "/reply-queue/a", "/bad", "", "t", "client",
                           "client-individual", "auto", "true", "false", "1", "-1", "x = 1",
                           "(", "T_t@@session-x@@1", "T_a@@s@@2", "guest", "nobody", "1000"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_commands, st.dictionaries(_keys, _values, max_size=5),
                          st.binary(max_size=10)), max_size=12))
def test_fuzz_frames_never_break_the_session(tmp_path_factory, frames):
    """Any sequence of frames ends in frames to the client (or silence), never an
    exception, and the session lets go of everything when the connection ends."""
    from broker.broker import Broker
    from broker.config import Config
    from broker.persistence import MemoryStore
    tmp = tmp_path_factory.mktemp("fuzz")
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=str(tmp / "data"),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0),
                    MemoryStore())
    service = StompService(broker)
    a, b = Client(service), Client(service)
    for i, (command, headers, body) in enumerate(frames):
        c = a if i % 2 else b
        c.send(command, body, h=headers)
    for c in (a, b):
        c.session.connection_lost()
        assert c.session not in broker.sessions
    for q in broker.vhosts["/"].queues.values():
        assert not q.consumers and q.unacked_count == 0


def test_durable_subscriptions_of_clients_with_ids_are_apart(broker, service):
    queues = broker.vhosts["/"].queues
    for client_id, topic in (("a", "/topic/x"), ("b", "/topic/y")):
        c = Client(service, connect={"client-id": client_id})
        c.send("SUBSCRIBE", destination=topic, id="1", durable="true")
        c.send("DISCONNECT")
    assert {"stomp-subscription-a-1", "stomp-subscription-b-1"} <= set(queues)
    assert [k[2] for _, k in queues["stomp-subscription-a-1"].bindings] == ["x"]


def test_a_refused_message_gets_an_error_not_a_receipt(broker, service):
    declare_queue(broker.vhosts["/"], "full",
                  arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    c = Client(service)
    assert c.send("SEND", b"x", destination="/amq/queue/full") == []  # no receipt asked
    (err,) = c.send("SEND", b"y", destination="/amq/queue/full", receipt="r")
    assert (err.headers["message"], err.headers["receipt-id"]) == ("Message rejected", "r")
    assert c.session.finished
