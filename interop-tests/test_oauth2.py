"""OAuth 2 tokens as passwords with the asyncio and kombu clients (tests/security/test_oauth2.py
covers pika, paho and httpx): a TrioMQ of the test's own started with --oauth2-* options and an
HS256 key, tokens signed by the test. Skipped against the reference RabbitMQ: its
rabbitmq_auth_backend_oauth2 is not configured on this machine."""
from __future__ import annotations

import asyncio
import time

import jwt
import pytest
from brokerproc import BrokerProc

SECRET = b"interop-shared-secret-32-bytes!!"
SCOPES = "rabbitmq.configure:*/ot-* rabbitmq.write:*/ot-* rabbitmq.read:*/ot-* " \
         "rabbitmq.write:*/amq.default"


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory, request):
    if request.config.getoption("--broker-url"):
        pytest.skip("the reference RabbitMQ here has no OAuth 2 backend configured")
    d = tmp_path_factory.mktemp("oauth2")
    (d / "hmac.key").write_bytes(SECRET)
    b = BrokerProc(d / "data", "memory", extra=[
        "--oauth2-resource-server-id", "rabbitmq",
        "--oauth2-signing-key", f"k1={d / 'hmac.key'}", "--oauth2-default-key", "k1"]).start()
    yield b
    b.stop()


def _token(sub: str = "interop", exp: float = 300) -> str:
    return jwt.encode({"sub": sub, "scope": SCOPES, "aud": "rabbitmq",
                       "exp": int(time.time() + exp)}, SECRET, "HS256", headers={"kid": "k1"})


def test_aio_pika_with_a_token(oauth_broker):
    import aio_pika
    import aiormq.exceptions

    async def main() -> None:
        conn = await aio_pika.connect(
            f"amqp://anyone:{_token()}@127.0.0.1:{oauth_broker.port}/")
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("ot-aio")
            await ch.default_exchange.publish(aio_pika.Message(b"hi"), routing_key="ot-aio")
            msg = await q.get(timeout=10, fail=False)
            for _ in range(50):
                if msg is not None:
                    break
                await asyncio.sleep(0.1)
                msg = await q.get(timeout=10, fail=False)
            assert msg is not None and msg.body == b"hi"
            await msg.ack()
            # outside the token's scopes: 403 on the channel
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await (await conn.channel()).declare_queue("elsewhere")
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(
                f"amqp://anyone:{_token(exp=-5)}@127.0.0.1:{oauth_broker.port}/")

    asyncio.run(asyncio.wait_for(main(), 60))


def test_kombu_with_a_token(oauth_broker):
    import kombu

    with kombu.Connection(f"amqp://anyone:{_token('kombu-user')}@127.0.0.1:"
                          f"{oauth_broker.port}//", connect_timeout=10) as conn:
        q = kombu.Queue("ot-kombu", routing_key="ot-kombu")
        with conn.Producer() as producer:
            producer.publish({"n": 1}, routing_key="ot-kombu", declare=[q], serializer="json")
        simple = conn.SimpleQueue(q)
        msg = simple.get(timeout=10)
        assert msg.payload == {"n": 1}
        msg.ack()
        simple.close()
