"""Round trips with other real client libraries: pika asyncio adapter, aio-pika, kombu (py-amqp)."""
from __future__ import annotations

import asyncio
import uuid

import pika
import pytest


def _run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---------------------------------------------------------------- pika asyncio adapter
def test_pika_asyncio_connection_round_trip(amqp_params):
    from pika.adapters.asyncio_connection import AsyncioConnection

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        state = {}

        def fail(*args):
            if not done.done():
                done.set_exception(AssertionError(f"failure: {args}"))

        def on_open(conn):
            conn.channel(on_open_callback=on_channel)

        def on_channel(ch):
            state["ch"] = ch
            ch.add_on_close_callback(lambda c, reason: state.setdefault("ch_closed", reason))
            ch.queue_declare("", exclusive=True, callback=on_declared)

        def on_declared(frame):
            q = frame.method.queue
            state["q"] = q
            ch = state["ch"]
            ch.confirm_delivery(on_confirm)
            ch.basic_consume(q, on_message, auto_ack=False)
            ch.basic_publish("", q, b"via-asyncio", pika.BasicProperties(correlation_id="c1"))

        def on_confirm(frame):
            state.setdefault("confirms", []).append(type(frame.method).__name__)

        def on_message(ch, method, props, body):
            ch.basic_ack(method.delivery_tag)
            if not done.done():
                done.set_result((method, props, body))

        conn = AsyncioConnection(amqp_params.pika_params(), on_open_callback=on_open,
                                 on_open_error_callback=fail, on_close_callback=lambda c, r: None,
                                 custom_ioloop=loop)
        try:
            method, props, body = await done
            assert body == b"via-asyncio" and props.correlation_id == "c1"
            assert method.routing_key == state["q"] and not method.redelivered
            for _ in range(100):
                if state.get("confirms"):
                    break
                await asyncio.sleep(0.02)
            assert state["confirms"] == ["Ack"]
        finally:
            closed = loop.create_future()
            conn.add_on_close_callback(lambda c, r: closed.done() or closed.set_result(r))
            if conn.is_open:
                conn.close()
                await asyncio.wait_for(closed, 10)

    _run(main())


def test_pika_asyncio_channel_error(amqp_params):
    from pika.adapters.asyncio_connection import AsyncioConnection
    name = f"itest-missing-{uuid.uuid4().hex[:8]}"

    async def main():
        loop = asyncio.get_running_loop()
        closed_reason = loop.create_future()

        def on_open(conn):
            conn.channel(on_open_callback=on_channel)

        def on_channel(ch):
            ch.add_on_close_callback(lambda c, reason: closed_reason.done() or closed_reason.set_result(reason))
            ch.queue_declare(name, passive=True)

        conn = AsyncioConnection(amqp_params.pika_params(), on_open_callback=on_open, custom_ioloop=loop)
        try:
            reason = await closed_reason
            assert isinstance(reason, pika.exceptions.ChannelClosedByBroker)
            assert (reason.reply_code, reason.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
        finally:
            done = loop.create_future()
            conn.add_on_close_callback(lambda c, r: done.done() or done.set_result(r))
            if conn.is_open:
                conn.close()
                await asyncio.wait_for(done, 10)

    _run(main())


# ---------------------------------------------------------------- aio-pika
def test_aio_pika_round_trip_and_exchange(amqp_params):
    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel()
            ex_name = f"itest-aio-{uuid.uuid4().hex[:8]}"
            ex = await ch.declare_exchange(ex_name, aio_pika.ExchangeType.TOPIC, auto_delete=True)
            q = await ch.declare_queue("", exclusive=True)
            await q.bind(ex, "a.#")
            await ex.publish(aio_pika.Message(b"hello", headers={"k": "v"}, message_id="m1"), routing_key="a.b.c")
            msg = await q.get(timeout=10, fail=True)
            assert msg.body == b"hello" and msg.headers == {"k": "v"} and msg.message_id == "m1"
            assert msg.routing_key == "a.b.c" and msg.exchange == ex_name
            await msg.ack()
            await q.unbind(ex, "a.#")  # last binding removed -> auto-delete exchange goes away
            await q.delete()

    _run(main())


def test_aio_pika_consume_iterator(amqp_params):
    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=5)
            q = await ch.declare_queue("", exclusive=True)
            for i in range(10):
                await ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=q.name)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(int(message.body))
                    if len(got) == 10:
                        break
            assert got == list(range(10))

    _run(main())


def test_aio_pika_channel_errors(amqp_params):
    import aio_pika
    import aiormq.exceptions

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel()
            name = f"itest-aio-{uuid.uuid4().hex[:8]}"
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as ei:
                await ch.declare_queue(name, passive=True)
            assert f"NOT_FOUND - no queue '{name}' in vhost '/'" in str(ei.value)
            ch = await conn.channel()
            await ch.declare_queue(name, exclusive=True)
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as ei:
                await ch.declare_queue(name, exclusive=True, auto_delete=True)
            assert f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{name}'" in str(ei.value)
            ch = await conn.channel()  # connection still usable
            await ch.declare_queue(name, passive=True)

    _run(main())


def test_aio_pika_broker_cancel(amqp_params):
    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel()
            name = f"itest-aio-{uuid.uuid4().hex[:8]}"
            q = await ch.declare_queue(name, auto_delete=False)
            async def on_message(message):
                pass

            tag = await q.consume(on_message)
            underlay = await ch.get_underlay_channel()
            assert tag in underlay.consumers
            other = await conn.channel()
            await other.queue_delete(name)
            for _ in range(200):
                if tag not in underlay.consumers:
                    break
                await asyncio.sleep(0.02)
            assert tag not in underlay.consumers, "aiormq did not see the broker's basic.cancel"

    _run(main())


# ---------------------------------------------------------------- kombu (py-amqp transport)
def test_kombu_producer_consumer_direct(amqp_params):
    import kombu

    uid = uuid.uuid4().hex[:8]
    exchange = kombu.Exchange(f"itest-kombu-{uid}", type="direct", durable=False, auto_delete=True)
    queue = kombu.Queue(f"itest-kombu-q-{uid}", exchange, routing_key="rk", auto_delete=True, durable=False)
    received = []
    with kombu.Connection(amqp_params.url, transport="amqp", connect_timeout=10) as conn:
        assert conn.transport.driver_name == "py-amqp"
        with conn.Consumer(queue, callbacks=[lambda body, msg: (received.append(body), msg.ack())],
                           accept=["json"]):
            producer = conn.Producer(serializer="json")
            producer.publish({"hello": "kombu", "n": 1}, exchange=exchange, routing_key="rk",
                             declare=[queue], retry=False)
            for _ in range(50):
                if received:
                    break
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
                except __import__("socket").timeout:
                    pass
        assert received == [{"hello": "kombu", "n": 1}]
        queue(conn.default_channel).delete()


def test_kombu_simple_queue(amqp_params):
    import kombu

    name = f"itest-kombu-simple-{uuid.uuid4().hex[:8]}"
    with kombu.Connection(amqp_params.url, transport="amqp", connect_timeout=10) as conn:
        q = conn.SimpleQueue(name, queue_opts={"durable": False, "auto_delete": False},
                             exchange_opts={"durable": False})
        try:
            q.put({"n": 1})
            q.put("two")
            m1 = q.get(block=True, timeout=10)
            assert m1.payload == {"n": 1}
            m1.ack()
            m2 = q.get(block=True, timeout=10)
            assert m2.payload == "two"
            m2.ack()
            with pytest.raises(q.Empty):
                q.get(block=True, timeout=0.3)
            q.put("three")
            conn.default_channel  # noqa: B018
            assert q.qsize() >= 0
        finally:
            q.queue.delete()
            try:
                q.queue.exchange(conn.default_channel).delete()
            except Exception:
                pass
            q.close()


def test_kombu_channel_error_reports_code(amqp_params):
    import amqp.exceptions
    import kombu

    with kombu.Connection(amqp_params.url, transport="amqp", connect_timeout=10) as conn:
        ch = conn.channel()
        name = f"itest-kombu-missing-{uuid.uuid4().hex[:8]}"
        with pytest.raises(amqp.exceptions.NotFound) as ei:
            ch.queue_declare(name, passive=True)
        assert ei.value.code == 404
        assert ei.value.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"
