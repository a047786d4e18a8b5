"""What a peer's declared sizes can make the broker hold, through the real edge: a content
header declaring a large body costs only what was sent, a publisher without write
permission is refused before its body is read, and an ended connection holds nothing."""
from __future__ import annotations

import trio

from broker.amqp import spec
from broker.amqp.codec import method_frame

from .amqp.sansio_helpers import HEADER, body_frame, conn_open, header_frame, start_ok, tune_ok
from .support import TrioClient

MiB = 1 << 20


def _head(channel: int, size: int, exchange: str = "") -> bytes:
    return method_frame(channel, spec.Basic.Publish(0, exchange, "k", False, False)) + \
        header_frame(channel, size)


def _held(handler) -> int:
    """Octets of body buffers a connection holds for contents in progress."""
    return sum(len(ch.body) for ch in handler.session.conn.channels.values()
               if ch.body is not None)


async def _login(port: int, user: str, password: str) -> TrioClient:
    client = TrioClient(await trio.open_tcp_stream("127.0.0.1", port))
    await client.send(HEADER)
    await client.expect(spec.Connection.Start)
    await client.send(start_ok("PLAIN", b"\0" + user.encode() + b"\0" + password.encode()))
    await client.expect(spec.Connection.Tune)
    await client.send(tune_ok(heartbeat=0) + conn_open("/"))
    await client.expect(spec.Connection.OpenOk)
    return client


async def _handler(server, client_count: int = 1) -> list:
    with trio.fail_after(10):
        while len(server.handlers) < client_count:  # noqa: ASYNC110 - waiting for accept
            await trio.sleep(0.01)
    return list(server.handlers)


async def test_a_declared_body_size_costs_only_what_was_sent(inprocess_broker):
    client = await TrioClient.connect(inprocess_broker.port)
    channels = range(1, 51)
    for ch in channels:
        await client.call(ch, spec.Channel.Open(), spec.Channel.OpenOk)
    # what the probe sent: a header declaring a large body, then one octet
    await client.send(b"".join(_head(ch, 100 * MiB) + body_frame(ch, b"x") for ch in channels))
    (handler,) = await _handler(inprocess_broker.server)
    conn = handler.session.conn
    with trio.fail_after(10):
        while sum(ch.received for ch in conn.channels.values()) < len(channels):  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert _held(handler) <= 2 * len(channels)
    await client.aclose()
    with trio.fail_after(10):
        while inprocess_broker.server.handlers:  # noqa: ASYNC110 - waiting for the teardown
            await trio.sleep(0.01)
    assert conn.partial_bytes == 0 and _held(handler) == 0


async def test_a_publisher_without_write_permission_is_refused_before_its_body(inprocess_broker):
    access = inprocess_broker.broker.access
    access.add_user("nobody", "pw")
    access.set_permissions("nobody", "/", "", "", "")  # may connect, nothing else
    client = await _login(inprocess_broker.port, "nobody", "pw")
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.send(_head(1, 100 * MiB) + body_frame(1, b"x" * 1000))
    close = (await client.expect(spec.Channel.Close, within=10)).method
    assert close.reply_code == 403
    assert close.reply_text == ("ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' "
                                "refused for user 'nobody'")
    assert (close.class_id, close.method_id) == (60, 40)
    # the rest of the body is dropped unread; the channel's close-ok ends it, the connection
    # goes on
    (handler,) = await _handler(inprocess_broker.server)
    await client.send(body_frame(1, b"x" * 100_000) + method_frame(1, spec.Channel.CloseOk()))
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    assert handler.session.conn.partial_bytes == 0
    await client.aclose()


async def test_a_permitted_large_publish_still_arrives_whole(inprocess_broker):
    client = await TrioClient.connect(inprocess_broker.port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.call(1, spec.Queue.Declare(queue="big"), spec.Queue.DeclareOk)
    body = bytes(range(256)) * 4096 + b"!"  # 1 MiB + 1, in eight frames and more
    await client.publish(1, body, routing_key="big")
    await client.call(1, spec.Basic.Get(queue="big", no_ack=True))
    got = await client.expect(spec.Basic.GetOk, within=10)
    assert got.body == body
    await client.aclose()



def test_partial_bodies_raise_the_memory_alarm_without_waiting_for_the_monitor(broker,
                                                                                session_client):
    """No resource monitor runs here: the memory alarm comes from the bodies' growth itself
    (every 16 MiB received into partial bodies), not from the once-a-second check."""
    from broker.broker import process_rss

    from .support import methods

    client = session_client()
    client.open_channel(1)
    broker.memory_limit = process_rss() + 8 * MiB
    client.send(_head(1, 100 * MiB))
    chunk = body_frame(1, b"m" * (131072 - 8))
    written = []
    for _ in range(48 * 8):  # 48 MiB of the body
        written += client.send(chunk)
        if broker.alarms:
            break
    assert "memory" in broker.alarms
    assert not methods(written, spec.Channel.Close)
    broker.set_alarm("memory", False)
    client.drop()
