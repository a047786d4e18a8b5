"""Super streams: made over AMQP 0-9-1 (as ``rabbitmq-streams add_super_stream`` lays them
out), the management API and ``ctl add_super_stream``; published to with pika through the
exchange and with rstream's SuperStreamProducer; consumed by rstream's SuperStreamConsumer
with single active consumer per partition across a group, a SIGKILLed member's partitions
taken over by the others. TrioMQ only: RabbitMQ 3.10 has no super streams (no
Partitions/Route or partitioned single active consumer).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import httpx
import pika
import pytest
from brokerproc import BrokerProc
from rstream import (
    AMQPMessage,
    OffsetSpecification,
    OffsetType,
    Producer,
    SuperStreamConsumer,
    SuperStreamProducer,
    amqp_decoder,
)

pytestmark = pytest.mark.timeout(180)

WAIT = 30.0  # a hang guard on a loaded machine, never a timing assertion
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def triomq(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("super") / "data", stream=True, http=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _name() -> str:
    return f"ss-{uuid.uuid4().hex[:8]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 150))


async def _until(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _amqp_super_stream(url: str, name: str, n: int) -> list[str]:
    """The exchange, partitions and bindings rabbitmq-streams add_super_stream declares."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
    parts = []
    for i in reversed(range(n)):  # declared out of order: Partitions sorts by the order
        part = f"{name}-{i}"
        ch.queue_declare(part, durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(part, name, str(i), arguments={"x-stream-partition-order": i})
        parts.insert(0, part)
    conn.close()
    return parts


def _publish(url: str, name: str, keys_bodies: list[tuple[str, bytes]]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for key, body in keys_bodies:
        ch.basic_publish(name, key, body, pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
    conn.close()


SAC = {"single-active-consumer": "true", "name": "grp"}

MEMBER = textwrap.dedent("""
    import asyncio, sys
    from rstream import SuperStreamConsumer, OffsetSpecification, OffsetType
    port, name = int(sys.argv[1]), sys.argv[2]

    async def main():
        c = SuperStreamConsumer("127.0.0.1", port=port, username="guest", password="guest",
                                super_stream=name)
        await c.start()

        async def on_message(msg, ctx):
            print("got", ctx.stream, flush=True)

        async def on_update(active, ctx):
            print("active" if active else "inactive", ctx.stream, flush=True)
            return OffsetSpecification(OffsetType.FIRST, 0)

        await c.subscribe(on_message, properties={"single-active-consumer": "true",
                          "name": "grp", "super-stream": name}, subscriber_name="grp",
                          consumer_update_listener=on_update)
        print("subscribed", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def test_group_shares_partitions_and_a_killed_member_is_replaced(triomq):
    """One member: active on all three partitions. A second joins: partition 1 moves to it
    (index % members, as RabbitMQ spreads them), the first told to step down there first.
    The second is SIGKILLed: the first is active on partition 1 again and reads it."""
    name = _name()
    parts = _amqp_super_stream(triomq.url, name, 3)
    _publish(triomq.url, name, [(str(i), b"a%d" % i) for i in range(3)])

    async def go():
        async with Producer("127.0.0.1", port=triomq.stream_port, username="guest",
                            password="guest") as p:
            client = await p.default_client
            assert await client.partitions(name) == parts
            assert await client.route("2", name) == [parts[2]]
        got: list = []
        updates: list = []

        async def on_message(msg, ctx):
            got.append((ctx.stream, bytes(msg.body)))

        async def on_update(active, ctx):
            updates.append((ctx.stream, active))
            return OffsetSpecification(OffsetType.FIRST, 0)

        one = SuperStreamConsumer("127.0.0.1", port=triomq.stream_port, username="guest",
                                  password="guest", super_stream=name)
        await one.start()
        await one.subscribe(on_message, decoder=amqp_decoder,
                            properties={**SAC, "super-stream": name}, subscriber_name="grp",
                            consumer_update_listener=on_update)
        await _until(lambda: len(got) == 3, "the first member's three messages")
        assert sorted(got) == [(parts[i], b"a%d" % i) for i in range(3)]
        assert sorted(updates) == [(p, True) for p in parts]

        member = await asyncio.create_subprocess_exec(
            sys.executable, "-c", MEMBER, str(triomq.stream_port), name,
            stdout=asyncio.subprocess.PIPE, cwd=ROOT)
        try:
            lines: list[str] = []

            async def read_until(want: str) -> None:
                while want not in lines:
                    line = await member.stdout.readline()  # type: ignore[union-attr]
                    if not line:
                        raise AssertionError(f"member ended before {want!r}: {lines}")
                    lines.append(line.decode().strip())

            await read_until(f"got {parts[1]}")
            # the first stepped down on partition 1 before the second was activated there
            assert (parts[1], False) in updates
            assert f"active {parts[1]}" in lines
            assert not any(ln.startswith("active") and not ln.endswith(parts[1])
                           for ln in lines)
            got.clear()
            _publish(triomq.url, name, [(str(i), b"b%d" % i) for i in range(3)])
            await _until(lambda: len(got) == 2, "the first member's partitions 0 and 2")
            assert sorted(got) == [(parts[0], b"b0"), (parts[2], b"b2")]
        finally:
            member.send_signal(signal.SIGKILL)
            await member.wait()
        # the first takes partition 1 back and reads it from where its listener says
        await _until(lambda: updates.count((parts[1], True)) == 2, "partition 1 taken back")
        await _until(lambda: (parts[1], b"b1") in got, "partition 1's messages")
        assert [b for s, b in got if s == parts[1]] == [b"a1", b"b1"]
        await one.close()

    run(go())


def test_super_stream_producer_and_management_and_ctl(triomq):
    """PUT /api/stream/super-streams (partitions), ctl add_super_stream --binding-keys;
    rstream's SuperStreamProducer routes by the client's hash; the exchange routes pika's
    publishes by binding key; DELETE removes the exchange and its streams."""
    from rstream import RouteType

    api = httpx.Client(base_url=triomq.http_url, auth=("guest", "guest"), timeout=30)
    name = _name()
    r = api.put(f"/api/stream/super-streams/%2F/{name}",
                json={"partitions": 2, "arguments": {"x-max-length-bytes": 10_000_000}})
    assert r.status_code == 201, r.text
    r = api.put(f"/api/stream/super-streams/%2F/{name}", json={"partitions": 2})
    assert r.status_code == 400 and "exists" in r.json()["reason"], r.text
    info = api.get(f"/api/stream/super-streams/%2F/{name}").json()
    assert info["partitions"] == [f"{name}-0", f"{name}-1"]
    assert info["binding_keys"] == ["0", "1"]
    q = api.get(f"/api/queues/%2F/{name}-1").json()
    assert q["type"] == "stream" and q["arguments"]["x-max-length-bytes"] == 10_000_000
    ex = api.get(f"/api/exchanges/%2F/{name}").json()
    assert ex["type"] == "direct" and ex["arguments"] == {"x-super-stream": True}

    other = _name()
    env = dict(os.environ, TRIOMQ_URL=triomq.http_url)
    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "add_super_stream", other,
                          "--binding-keys", "eu,us"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert api.get(f"/api/stream/super-streams/%2F/{other}").json()["partitions"] == [
        f"{other}-eu", f"{other}-us"]
    _publish(triomq.url, other, [("us", b"u1"), ("eu", b"e1")])

    async def key_of(message):
        return message.application_properties["k"]

    async def go():
        async with SuperStreamProducer(
                "127.0.0.1", port=triomq.stream_port, username="guest", password="guest",
                super_stream=name, routing=RouteType.Hash, routing_extractor=key_of) as prod:
            for i in range(4):
                await prod.send(AMQPMessage(body=b"h%d" % i,
                                            application_properties={"k": str(i)}))
        seen: dict = {}

        async def on_message(msg, ctx):
            seen.setdefault(ctx.stream, []).append(bytes(msg.body))

        for ss, n in ((name, 4), (other, 2)):
            c = SuperStreamConsumer("127.0.0.1", port=triomq.stream_port, username="guest",
                                    password="guest", super_stream=ss)
            await c.start()
            await c.subscribe(on_message, decoder=amqp_decoder)
            await _until(lambda ss=ss, n=n: sum(len(v) for k, v in seen.items()
                                                if k.startswith(ss)) == n, ss)
            await c.close()
        return seen

    seen = run(go())
    assert seen[f"{other}-eu"] == [b"e1"] and seen[f"{other}-us"] == [b"u1"]
    assert sorted(seen.get(f"{name}-0", []) + seen.get(f"{name}-1", [])) == [
        b"h0", b"h1", b"h2", b"h3"]

    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "delete_super_stream", other],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert api.delete(f"/api/stream/super-streams/%2F/{name}").status_code == 204
    for n in (name, other):
        assert api.get(f"/api/stream/super-streams/%2F/{n}").status_code == 404
        assert api.get(f"/api/exchanges/%2F/{n}").status_code == 404
    assert api.get(f"/api/queues/%2F/{name}-0").status_code == 404
    assert api.get(f"/api/queues/%2F/{other}-eu").status_code == 404
