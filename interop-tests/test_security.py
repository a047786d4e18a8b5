"""Authentication and access."""
from __future__ import annotations

import asyncio

import pika
import pika.exceptions
import pytest
from helpers import get_one

LOGIN_REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"


def test_guest_from_loopback(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hi")
    assert get_one(ch, q)[2] == b"hi"


@pytest.mark.parametrize("user,password", [("guest", "wrong-password"), ("itest-no-such-user", "guest"),
                                           ("guest", "")])
def test_bad_credentials_pika(amqp_params, user, password):
    params = amqp_params.pika_params(credentials=pika.PlainCredentials(user, password))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as ei:
        pika.BlockingConnection(params)
    msg = str(ei.value)
    assert "(403)" in msg and LOGIN_REFUSED in msg, msg


def test_bad_credentials_raw_close_frame(raw_socket):
    r = raw_socket()
    r.start()
    r.start_ok("PLAIN", b"\x00guest\x00nope")
    code, text, cid, mid = r.expect_connection_close()
    assert (code, cid, mid) == (403, 0, 0)
    assert text == LOGIN_REFUSED + ". For details see the broker logfile."
    r.read_until_closed(5)


def test_malformed_plain_response(raw_socket, assert_broker_alive):
    r = raw_socket()
    r.start()
    r.start_ok("PLAIN", b"no-nul-separators")
    # RabbitMQ drops the socket without a connection.close for an undecodable PLAIN response
    assert r.read_until_closed(5) == b""
    assert_broker_alive()


def test_bad_credentials_aio_pika(amqp_params):
    import aio_pika
    import aiormq.exceptions

    async def main():
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as ei:
            await aio_pika.connect(amqp_params.url_with(password="wrong-password"))
        assert LOGIN_REFUSED in str(ei.value)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_bad_credentials_kombu(amqp_params):
    import amqp.exceptions
    import kombu

    url = amqp_params.url_with(password="wrong-password")
    with kombu.Connection(url, connect_timeout=10) as c, \
            pytest.raises(amqp.exceptions.AccessRefused) as ei:
        c.connect()
    assert ei.value.code == 403 and LOGIN_REFUSED in str(ei.value)
