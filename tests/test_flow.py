"""Flow control: publishers into queues that grow faster than they drain are slowed.

White-box tests drive real sessions without sockets (``SessionClient``); the edge tests run
the real server in-process (``inprocess_broker``). Behaviour only, no timing asserts:
docs/architecture.md "Back-pressure and bounded buffers".
"""
from __future__ import annotations

import pytest
import trio

from broker.amqp import spec

from .support import TrioClient, methods

HIGH, LOW = 10, 5


@pytest.fixture
def flow_broker(broker):
    broker.config.flow_high = HIGH
    broker.config.flow_low = LOW
    return broker


def _publisher(session_client, queue="q"):
    pub = session_client()
    pub.open_channel(1)
    pub.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    return pub


def _slow_consumer(session_client, queue="q", prefetch=1):
    sub = session_client()
    sub.open_channel(1)
    sub.declare_queue(1, queue)
    sub.ok(1, spec.Basic.Qos(0, prefetch, False), spec.Basic.QosOk)
    sub.consume(1, queue, tag="c")
    return sub


def _ack_one(sub) -> list:
    """Ack the oldest unacknowledged delivery of ``sub``; returns what it was sent."""
    tag = min(sub.session.channels[1].unacked)
    return sub.call(1, spec.Basic.Ack(tag, False))


def test_publisher_into_a_queue_that_grows_is_in_flow_until_it_drains(flow_broker, session_client):
    sub = _slow_consumer(session_client)
    pub = _publisher(session_client)
    resumed = []
    pub.session.flow_resumed = lambda: resumed.append(True)
    queue = flow_broker.vhosts["/"].queues["q"]
    for i in range(HIGH + 1):  # one delivered (prefetch 1), HIGH ready
        pub.publish(1, b"m%d" % i, routing_key="q")
    assert pub.session.flow_state == "running"
    written = pub.publish(1, b"over", routing_key="q")
    assert pub.session.flow_state == "flow" and pub.session.in_flow
    assert queue.flow_waiters == {pub.session}
    # Confirms are not withheld: flow only stops the edge from reading more.
    assert methods(written, spec.Basic.Ack)
    while len(queue.ready) > LOW + 1:
        _ack_one(sub)
        assert pub.session.flow_state == "flow" and not resumed
    _ack_one(sub)  # the ready list reaches the low-water mark
    assert len(queue.ready) == LOW
    assert pub.session.flow_state == "running" and resumed == [True]
    assert not queue.flow_waiters


def test_consumer_only_connection_is_never_in_flow(flow_broker, session_client):
    sub = _slow_consumer(session_client)
    pub = _publisher(session_client)
    for i in range(3 * HIGH):
        pub.publish(1, b"m%d" % i, routing_key="q")
    assert pub.session.in_flow
    for _ in range(HIGH):
        _ack_one(sub)
        assert sub.session.flow_state == "running"


def test_connection_that_consumes_is_not_stopped_by_queues(flow_broker, session_client):
    """A connection with consumers (or unacked messages) must keep being read: its acks may be
    what drains the queue. It publishes into an over-threshold queue without entering flow."""
    both = _slow_consumer(session_client)
    both.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    for i in range(3 * HIGH):
        both.publish(1, b"m%d" % i, routing_key="q")
    assert len(flow_broker.vhosts["/"].queues["q"].ready) > HIGH
    assert both.session.flow_state == "running"


def test_queue_without_consumers_does_not_throttle(flow_broker, session_client):
    pub = _publisher(session_client)
    pub.declare_queue(1, "backlog")
    for i in range(10 * HIGH):
        pub.publish(1, b"m%d" % i, routing_key="backlog")
    assert len(flow_broker.vhosts["/"].queues["backlog"].ready) == 10 * HIGH
    assert pub.session.flow_state == "running"


@pytest.mark.parametrize("how", ["cancel", "purge", "delete"])
def test_flow_ends_when_the_queue_stops_throttling(flow_broker, session_client, how):
    sub = _slow_consumer(session_client)
    pub = _publisher(session_client)
    for i in range(2 * HIGH):
        pub.publish(1, b"m%d" % i, routing_key="q")
    assert pub.session.in_flow
    if how == "cancel":
        sub.call(1, spec.Basic.Cancel("c"))
    elif how == "purge":
        sub.call(1, spec.Queue.Purge(queue="q"))
    else:
        sub.call(1, spec.Queue.Delete(queue="q"))
    assert pub.session.flow_state == "running"


def test_flow_with_two_queues_ends_when_both_drained(flow_broker, session_client):
    sub_a = _slow_consumer(session_client, "a")
    sub_b = _slow_consumer(session_client, "b")
    pub = _publisher(session_client)
    for i in range(2 * HIGH):
        pub.publish(1, b"m%d" % i, routing_key="a")
        pub.publish(1, b"m%d" % i, routing_key="b")
    assert pub.session.in_flow
    for _ in range(2 * HIGH):
        _ack_one(sub_a)
    assert pub.session.flow_state == "flow"  # still throttled by b
    for _ in range(2 * HIGH):
        _ack_one(sub_b)
    assert pub.session.flow_state == "running"


def test_lost_connection_leaves_no_flow_waiter(flow_broker, session_client):
    _slow_consumer(session_client)
    pub = _publisher(session_client)
    for i in range(2 * HIGH):
        pub.publish(1, b"m%d" % i, routing_key="q")
    queue = flow_broker.vhosts["/"].queues["q"]
    assert queue.flow_waiters == {pub.session}
    pub.drop()
    assert not queue.flow_waiters and not pub.session.in_flow


def test_large_messages_put_a_publisher_in_flow_by_their_bytes(broker, session_client):
    """A few large messages are as much as many small ones: the ready bodies' bytes have a
    threshold of their own, and the queue must be back under both marks to release."""
    broker.config.flow_high_bytes, broker.config.flow_low_bytes = 3000, 1500
    sub = _slow_consumer(session_client)
    pub = _publisher(session_client)
    queue = broker.vhosts["/"].queues["q"]
    body = b"x" * 1000
    for _ in range(4):  # one delivered (prefetch 1), 3000 bytes ready
        pub.publish(1, body, routing_key="q")
    assert pub.session.flow_state == "running"
    pub.publish(1, body, routing_key="q")
    assert pub.session.flow_state == "flow" and queue.ready_bytes == 4000
    _ack_one(sub)
    _ack_one(sub)
    assert queue.ready_bytes == 2000 and pub.session.flow_state == "flow"
    _ack_one(sub)
    assert queue.ready_bytes == 1000 and pub.session.flow_state == "running"


# ---- through the real server ----------------------------------------------------------
def _tune(broker) -> None:
    broker.config.flow_high = HIGH
    broker.config.flow_low = LOW
    broker.config.flow_read_slice = 1024  # a handful of publishes per slice


async def _consumer(port: int, queue: str, prefetch: int) -> TrioClient:
    sub = await TrioClient.connect(port)
    await sub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await sub.call(1, spec.Queue.Declare(queue=queue), spec.Queue.DeclareOk)
    await sub.call(1, spec.Basic.Qos(0, prefetch, False), spec.Basic.QosOk)
    await sub.call(1, spec.Basic.Consume(queue=queue, consumer_tag="c"), spec.Basic.ConsumeOk)
    return sub


async def test_queue_stays_bounded_while_publishers_outrun_a_consumer(inprocess_broker, nursery):
    _tune(inprocess_broker.broker)
    port = inprocess_broker.port
    total = 600
    sub = await _consumer(port, "slow", prefetch=5)
    queue = inprocess_broker.broker.vhosts["/"].queues["slow"]
    states: set[str] = set()
    pubs = []
    for _ in range(2):
        pub = await TrioClient.connect(port)
        await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
        await pub.call(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
        pubs.append(pub)

    async def publish_all(pub):
        for i in range(total):
            await pub.publish(1, b"%d" % i, routing_key="slow")

    for pub in pubs:
        nursery.start_soon(publish_all, pub)
    longest = 0
    for _ in range(2 * total):  # the consumer acks one by one, yielding in between
        got = await sub.expect(spec.Basic.Deliver, within=10)
        longest = max(longest, len(queue.ready))
        for handler in inprocess_broker.server.handlers:
            states.add(handler.session.flow_state)
        await sub.call(1, spec.Basic.Ack(got.method.delivery_tag, False))
        await trio.lowlevel.checkpoint()
    # Without flow control the publishers' 1,200 messages would pile up in the queue.
    assert longest < 200, longest
    assert states == {"flow", "running"}
    for pub in pubs:  # every publish was confirmed in the end
        confirmed = 0
        while confirmed < total:
            ack = (await pub.expect(spec.Basic.Ack)).method
            confirmed = ack.delivery_tag
        await pub.call(0, spec.Connection.Close(200, "bye", 0, 0), spec.Connection.CloseOk)
        await pub.aclose()
    await sub.aclose()


async def test_in_flow_connection_still_gets_its_close_handled(inprocess_broker):
    _tune(inprocess_broker.broker)
    port = inprocess_broker.port
    sub = await _consumer(port, "stuck", prefetch=1)  # never acks
    pub = await TrioClient.connect(port)
    await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    for i in range(4 * HIGH):
        await pub.publish(1, b"%d" % i, routing_key="stuck")
    (handler,) = [h for h in inprocess_broker.server.handlers if h.session.is_publisher]
    with trio.fail_after(5):
        while not handler.session.in_flow:  # noqa: ASYNC110 - waiting for the reader
            await trio.sleep(0.01)
    await pub.call(0, spec.Connection.Close(200, "bye", 0, 0))
    while True:  # confirms are off: the next method is the close-ok
        item = await pub.next(within=10)
        assert item is not None
        if isinstance(item.method, spec.Connection.CloseOk):
            break
    await pub.aclose()
    await sub.aclose()


# ---- resource alarms: a blocked publisher is not read at all ---------------------------
ALARM = "test alarm"  # raised by hand (the resource monitor sets memory and disk itself)


async def _wait_for(cond, what: str, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while not cond():  # noqa: ASYNC110 - polling the broker's state
            await trio.sleep(0.01)


async def _blocked_publisher(server, port: int, heartbeat: int = 0):
    """A connection that has published once, then blocked by an alarm: (client, handler)."""
    pub = TrioClient(await trio.open_tcp_stream("127.0.0.1", port))
    await pub.handshake(heartbeat=heartbeat)
    await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await pub.call(1, spec.Queue.Declare(queue="alarmed"), spec.Queue.DeclareOk)
    await pub.publish(1, b"before", routing_key="alarmed")
    await _wait_for(lambda: any(h.session.is_publisher for h in server.handlers), "a publisher")
    (handler,) = [h for h in server.handlers if h.session.is_publisher]
    server.broker.set_alarm(ALARM, True)
    await _wait_for(lambda: handler.alarm_blocked, "the publisher blocked")
    return pub, handler


async def test_a_publisher_blocked_by_an_alarm_is_not_read_at_all(inprocess_broker, nursery):
    server = inprocess_broker.server
    pub, handler = await _blocked_publisher(server, inprocess_broker.port)
    conn = handler.session.conn
    queue = server.broker.vhosts["/"].queues["alarmed"]
    read = conn.recv_oct
    sent = trio.Event()

    async def publish_all():  # (what the kernel's buffers do not take waits here)
        for i in range(400):
            await pub.publish(1, b"x" * 1000 + b"%d" % i, routing_key="alarmed")
        sent.set()

    nursery.start_soon(publish_all)
    # A negative: nothing is read while the alarm holds (the old trickle read 4 KiB every
    # 0.1 s; 1.5 s would have let ~60 KB through).
    await trio.sleep(1.5)
    assert conn.recv_oct == read
    assert len(queue.ready) == 1
    server.broker.set_alarm(ALARM, False)
    await _wait_for(lambda: len(queue.ready) == 401, "the held publishes after the alarm")
    with trio.fail_after(10):
        await sent.wait()
    await pub.aclose()


async def test_a_blocked_publisher_is_not_timed_out_for_unread_heartbeats(inprocess_broker):
    server = inprocess_broker.server
    pub, handler = await _blocked_publisher(server, inprocess_broker.port, heartbeat=1)
    # no frame from the client for more than twice the heartbeat: not read, not counted
    await trio.sleep(3)
    assert handler in server.handlers
    server.broker.set_alarm(ALARM, False)
    await _wait_for(lambda: not handler.alarm_blocked, "the publisher unblocked")
    await pub.call(1, spec.Basic.Qos(0, 1, False), spec.Basic.QosOk)
    await pub.aclose()


async def test_a_consumer_that_never_published_is_read_while_an_alarm_holds(inprocess_broker):
    server = inprocess_broker.server
    sub = await _consumer(inprocess_broker.port, "alarmed", prefetch=1)
    pub, _handler = await _blocked_publisher(server, inprocess_broker.port)
    got = await sub.expect(spec.Basic.Deliver, within=10)
    await sub.call(1, spec.Basic.Ack(got.method.delivery_tag, False))
    consumer = next(h for h in server.handlers if not h.session.is_publisher)
    await _wait_for(lambda: not any(ch.unacked for ch in consumer.session.channels.values()),
                    "the consumer's ack handled under the alarm")
    server.broker.set_alarm(ALARM, False)
    await pub.aclose()
    await sub.aclose()


async def test_a_blocked_publisher_closed_by_the_broker_gets_its_close_ok_read(inprocess_broker):
    from broker import errors
    server = inprocess_broker.server
    pub, handler = await _blocked_publisher(server, inprocess_broker.port)
    handler.session.force_close(errors.connection_forced("closed by an operator"))
    await pub.expect(spec.Connection.Close, within=10)
    await pub.call(0, spec.Connection.CloseOk())
    await _wait_for(lambda: handler not in server.handlers, "the connection ended", within=10)
    server.broker.set_alarm(ALARM, False)
    await pub.aclose()


def test_a_failing_stores_alarm_stops_publishers_as_any_alarm(broker):
    """A store whose writes fail raises an alarm named after it, which stops reading
    publishers as the memory and disk alarms do (it used to read them slowly: 4 KiB every
    0.1 s while nothing could be stored); tests/persistence/test_store_failure_blocking.py
    checks it on a real full disk."""
    from broker.persistence.base import BLOCKS_ON_FAILURE

    class FailingStore:
        name = "journal"
        capabilities = frozenset({BLOCKS_ON_FAILURE})

    store = FailingStore()
    assert not broker.stops_publishers
    broker.on_store_failure(store, "no space left on device")
    assert broker.blocked and broker.stops_publishers
    broker.set_alarm("memory", True)
    broker.on_store_recovered(store)
    assert broker.stops_publishers
    broker.set_alarm("memory", False)
    assert not broker.blocked and not broker.stops_publishers
