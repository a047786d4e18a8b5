"""A delayed message's x-delay runs from its arrival at the broker, not from the moment the
broker got round to it: publishes that wait in the socket (a burst behind earlier ones, a
loaded machine, a publisher not read while an alarm holds) are not due later for it.

The real server in-process; the message is held unread by a resource alarm (its socket
is not read at all while the alarm holds), so the wait is certain. Its due time is
compared with when it was sent, by a margin of the whole hold: no timing assert."""
from __future__ import annotations

import socket
import time

import trio

from broker.amqp import spec
from broker.listeners.amqp_receive import arrived_ago, stamp_arrivals

from ..support import TrioClient

ALARM = "test alarm"
HOLD = 1.5  # seconds the publish waits unread in the socket
DELAY_MS = 60_000  # pending long after the hold either way


async def _wait_for(cond, what: str, within: float = 20.0) -> None:
    with trio.fail_after(within):
        while not cond():  # noqa: ASYNC110 - polling the broker's state
            await trio.sleep(0.01)


async def test_a_delay_runs_from_the_arrival_not_from_the_read(inprocess_broker):
    server = inprocess_broker.server
    broker = server.broker
    pub = TrioClient(await trio.open_tcp_stream("127.0.0.1", inprocess_broker.port))
    await pub.handshake()
    await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await pub.call(1, spec.Exchange.Declare(exchange="arrival.x", type="x-delayed-message",
                                            arguments={"x-delayed-type": "direct"}),
                   spec.Exchange.DeclareOk)
    await pub.call(1, spec.Queue.Declare(queue="arrival.q"), spec.Queue.DeclareOk)
    await pub.call(1, spec.Queue.Bind(queue="arrival.q", exchange="arrival.x", routing_key="k"),
                   spec.Queue.BindOk)
    await pub.publish(1, b"first", routing_key="arrival.q")  # a publisher, so an alarm blocks it
    await _wait_for(lambda: any(h.session.is_publisher for h in server.handlers), "a publisher")
    (handler,) = [h for h in server.handlers if h.session.is_publisher]
    broker.set_alarm(ALARM, True)
    await _wait_for(lambda: handler.alarm_blocked, "the publisher blocked")

    await pub.publish(1, b"delayed", exchange="arrival.x", routing_key="k",
                      headers={"x-delay": DELAY_MS})
    sent = time.time()  # it is in the broker's socket by now
    await trio.sleep(HOLD)  # unread: the alarm holds
    assert broker.scheduler.pending == 0
    broker.set_alarm(ALARM, False)
    await _wait_for(lambda: broker.scheduler.pending == 1, "the delayed publish read")
    (item,) = broker.scheduler.items.values()
    # due DELAY_MS after it arrived (by `sent`); counted from its read it would be HOLD
    # seconds later
    assert sent + 60.0 - HOLD / 3 < item.due < sent + 60.0 + HOLD / 3, item.due - sent
    await pub.aclose()


def test_the_kernel_tells_when_a_read_arrived():
    """What a read returns arrived when the kernel received it, not when it was read."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                anc_size = stamp_arrivals(server)
                assert anc_size  # Linux
                client.sendall(b"x" * 100)
                time.sleep(0.3)
                data, anc, _flags, _addr = server.recvmsg(1000, anc_size)
                assert data == b"x" * 100
                assert arrived_ago(anc) >= 0.3
                assert arrived_ago([]) == 0.0


class _SteppedClock:
    """The wall clock after a step of an hour forward (NTP, an operator), as the receive code
    sees it: the kernel stamped the publish before the step."""

    @staticmethod
    def time() -> float:
        return time.time() + 3600.0


async def test_a_wall_clock_step_does_not_make_a_delay_start_early(inprocess_broker, monkeypatch):
    from broker.listeners import amqp_receive

    server = inprocess_broker.server
    broker = server.broker
    pub = TrioClient(await trio.open_tcp_stream("127.0.0.1", inprocess_broker.port))
    await pub.handshake()
    await pub.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await pub.call(1, spec.Exchange.Declare(exchange="step.x", type="x-delayed-message",
                                            arguments={"x-delayed-type": "direct"}),
                   spec.Exchange.DeclareOk)
    await pub.call(1, spec.Queue.Declare(queue="step.q"), spec.Queue.DeclareOk)
    await pub.call(1, spec.Queue.Bind(queue="step.q", exchange="step.x", routing_key="k"),
                   spec.Queue.BindOk)
    monkeypatch.setattr(amqp_receive, "time", _SteppedClock)
    sent = time.time()
    await pub.publish(1, b"delayed", exchange="step.x", routing_key="k",
                      headers={"x-delay": DELAY_MS})
    await _wait_for(lambda: broker.scheduler.pending + broker.scheduler.fired == 1,
                    "the delayed publish read")
    assert broker.scheduler.fired == 0  # it fired at once: due an hour before its arrival
    (item,) = broker.scheduler.items.values()
    # the hour of the step is not counted as a wait in the socket (it would be due at once)
    assert item.due > sent + 60.0 - 30.0, item.due - sent
    await pub.aclose()
