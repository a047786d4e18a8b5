"""Large bodies consumed with aio-pika and pika: deliveries of 1 MiB and more are written
from a worker thread (several at once in one gathering write), small ones from the event
loop; every body arrives whole and in publish order, interleaved with small ones."""
from __future__ import annotations

import asyncio
import random

MiB = 1 << 20


def _bodies() -> list[bytes]:
    rnd = random.Random(7)
    sizes = [MiB, 5, 3 * MiB + 17, 64 * 1024, 0, MiB - 1, 300 * 1024, 9] * 2
    return [bytes([i]) + rnd.randbytes(max(size - 1, 0)) if size else b""
            for i, size in enumerate(sizes)]


def test_aio_pika_consumes_large_bodies_in_order(amqp_params):
    import aio_pika

    bodies = _bodies()

    async def main():
        conn = await aio_pika.connect(amqp_params.url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue("", exclusive=True)
            for body in bodies:
                await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
            got = []
            async with q.iterator(no_ack=True) as it:
                async for msg in it:
                    got.append(msg.body)
                    if len(got) == len(bodies):
                        break
            assert [len(b) for b in got] == [len(b) for b in bodies]
            assert got == bodies

    asyncio.run(asyncio.wait_for(main(), 60))


def test_pika_consumes_large_bodies_in_order(conn):
    bodies = _bodies()
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for body in bodies:
        ch.basic_publish("", q, body)
    ch.basic_qos(prefetch_count=4)
    got = []
    for method, _props, body in ch.consume(q, inactivity_timeout=30):
        assert method is not None, "timed out"
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    ch.cancel()
    assert got == bodies
