"""Connection class: protocol header, start/tune/open, heartbeats, close."""
from __future__ import annotations

import struct
import time

import pika
import pika.exceptions
import pytest

import rawamqp
from rawamqp import (
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN_OK,
    Closed,
    amqplain_response,
    plain_response,
    shortstr,
)

EXPECTED_CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "authentication_failure_close",
    "per_consumer_qos",
]


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x02",       # wrong revision
    b"AMQP\x01\x01\x00\x0a",       # AMQP 0-10 style header
    b"XMQP\x00\x00\x09\x01",       # wrong magic
])
def test_wrong_protocol_header_gets_supported_header_and_close(raw_socket, header):
    r = raw_socket()
    r.send(header)
    data = r.read_until_closed(timeout=5)
    assert data == b"AMQP\x00\x00\x09\x01"


def test_amqp10_sasl_header_on_the_amqp_port(raw_socket, external_broker):
    """AMQP 1.0's SASL header: served as AMQP 1.0 (SASL header and sasl-mechanisms back) by
    TrioMQ, as RabbitMQ 4 and RabbitMQ 3.10 with rabbitmq_amqp1_0 do; RabbitMQ 3.10
    without the plugin answers with its 0-9-1 header and closes."""
    r = raw_socket()
    r.send(b"AMQP\x03\x01\x00\x00")
    data = r.recv_exact(8, timeout=5)
    if external_broker and data == b"AMQP\x00\x00\x09\x01":
        return  # the machine's RabbitMQ without its AMQP 1.0 plugin
    assert data == b"AMQP\x03\x01\x00\x00"


def test_connection_start_fields(raw_socket):
    r = raw_socket()
    assert r.start() == (0, 9)
    assert "PLAIN" in r.mechanisms and "AMQPLAIN" in r.mechanisms
    assert "en_US" in r.locales
    props = r.server_properties
    for key in ("product", "version", "platform", "copyright", "information", "capabilities"):
        assert key in props, key


def test_server_capabilities_raw(raw_socket):
    r = raw_socket()
    r.start()
    caps = r.server_properties["capabilities"]
    for cap in EXPECTED_CAPABILITIES:
        assert caps.get(cap) is True, (cap, caps)


def test_server_capabilities_pika(conn):
    caps = conn._impl.server_properties["capabilities"]
    for cap in EXPECTED_CAPABILITIES:
        assert caps.get(cap) is True, (cap, caps)


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_mechanisms_raw(raw_socket, amqp_params, mechanism):
    r = raw_socket()
    r.start()
    if mechanism == "PLAIN":
        resp = plain_response(amqp_params.username, amqp_params.password)
    else:
        resp = amqplain_response(amqp_params.username, amqp_params.password)
    r.start_ok(mechanism, resp)
    channel_max, frame_max, heartbeat = r.read_tune()
    r.tune_ok(channel_max, frame_max, 0)
    r.open(amqp_params.vhost)
    r.expect(CONNECTION_OPEN_OK, 0)
    r.channel_open(1)
    q, count, consumers = r.queue_declare(1, "", exclusive=True)
    assert q.startswith("amq.gen-") and count == 0 and consumers == 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_mechanisms_wrong_password(raw_socket, amqp_params, mechanism):
    r = raw_socket()
    r.start()
    if mechanism == "PLAIN":
        resp = plain_response(amqp_params.username, "definitely-wrong")
    else:
        resp = amqplain_response(amqp_params.username, "definitely-wrong")
    r.start_ok(mechanism, resp)
    code, text, cid, mid = r.expect_connection_close()
    assert code == 403
    assert text.startswith(f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}")


def test_unknown_mechanism_closes_socket(raw_socket, assert_broker_alive):
    r = raw_socket()
    r.start()
    r.start_ok("NO-SUCH-MECH", b"x")
    # RabbitMQ just drops the socket here (no connection.close frame).
    data = r.read_until_closed(timeout=5)
    if data:
        reader = rawamqp.Reader(data[7:])
        assert (reader.short(), reader.short()) == CONNECTION_CLOSE
    assert_broker_alive()


def test_tune_defaults(raw_socket):
    r = raw_socket()
    r.start()
    r.start_ok()
    channel_max, frame_max, heartbeat = r.read_tune()
    # RabbitMQ 3.x defaults
    assert channel_max == 2047
    assert frame_max == 131072
    assert heartbeat == 60


def test_pika_negotiates_tune_values(connect):
    c = connect(heartbeat=2, frame_max=8192, channel_max=64)
    assert c._impl.params.heartbeat == 2
    assert c._impl.params.frame_max == 8192
    assert c._impl.params.channel_max == 64
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = b"x" * 50000  # several body frames at frame_max 8192
    ch.basic_publish("", q, body)
    from helpers import get_one
    assert get_one(ch, q)[2] == body


def test_pika_heartbeat_keeps_connection_alive(connect):
    c = connect(heartbeat=1)
    assert c._impl.params.heartbeat == 1
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    c.sleep(3.5)  # pika sends heartbeats while sleeping
    assert c.is_open
    ch.basic_publish("", q, b"after-idle")
    from helpers import get_one
    assert get_one(ch, q)[2] == b"after-idle"


def test_server_sends_heartbeats_and_drops_silent_client(raw_socket):
    r = raw_socket(timeout=15)
    r.start()
    r.start_ok()
    r.read_tune()
    r.tune_ok(heartbeat=1)
    r.open()
    r.expect(CONNECTION_OPEN_OK, 0)
    t0 = time.monotonic()
    heartbeats = 0
    with pytest.raises(Closed):
        while True:
            ftype, channel, payload = r.read_frame(timeout=15)
            assert ftype == rawamqp.FRAME_HEARTBEAT, (ftype, payload)
            assert channel == 0 and payload == b""
            heartbeats += 1
    elapsed = time.monotonic() - t0
    assert heartbeats >= 1
    # missed heartbeats: dropped after roughly two intervals (RabbitMQ: ~2-3 s for 1 s)
    assert 1.5 <= elapsed <= 10, elapsed


def test_client_heartbeats_keep_raw_connection_open(raw_socket):
    r = raw_socket(timeout=10)
    r.start()
    r.start_ok()
    r.read_tune()
    r.tune_ok(heartbeat=1)
    r.open()
    r.expect(CONNECTION_OPEN_OK, 0)
    end = time.monotonic() + 4
    while time.monotonic() < end:
        r.send(rawamqp.heartbeat_frame())
        try:
            r.read_frame(timeout=0.4)
        except TimeoutError:
            pass
    r.channel_open(1)  # still alive
    r.queue_declare(1, "", exclusive=True)


def test_heartbeat_zero_disables(raw_socket):
    r = raw_socket()
    r.handshake(heartbeat=0)
    with pytest.raises(TimeoutError):
        r.read_frame(timeout=2.5)  # no heartbeat frames at all


def test_open_unknown_vhost_raw(raw_socket):
    r = raw_socket()
    r.start()
    r.start_ok()
    r.read_tune()
    r.tune_ok()
    r.open("/no-such-vhost-itest")
    code, text, cid, mid = r.expect_connection_close()
    assert (code, cid, mid) == (530, 10, 40)
    assert text == "NOT_ALLOWED - vhost /no-such-vhost-itest not found"


def test_open_unknown_vhost_pika(amqp_params):
    params = amqp_params.pika_params(virtual_host="no-such-vhost-itest")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as ei:
        pika.BlockingConnection(params)
    assert "(530) 'NOT_ALLOWED - vhost no-such-vhost-itest not found'" in str(ei.value)


def test_client_initiated_close(raw_socket):
    r = raw_socket()
    r.handshake()
    r.channel_open(1)
    r.send_method(0, CONNECTION_CLOSE, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0))
    r.expect(CONNECTION_CLOSE_OK, 0)


def test_server_initiated_close_then_socket_closed(raw_socket):
    r = raw_socket()
    r.handshake()
    # channel.open twice on the same channel is a connection error
    r.channel_open(1)
    r.send_method(1, rawamqp.CHANNEL_OPEN, shortstr(""))
    code, text, cid, mid = r.expect_connection_close(close_ok=True)
    assert code == 504
    # after our close-ok, the server closes the socket
    r.read_until_closed(timeout=5)


def test_methods_after_server_close_are_ignored_until_close_ok(raw_socket):
    r = raw_socket()
    r.handshake()
    r.channel_open(1)
    r.send_method(1, rawamqp.CHANNEL_OPEN, shortstr(""))
    code, text, cid, mid = r.expect_connection_close(close_ok=False)
    assert code == 504
    # Anything other than close-ok is discarded by the server ...
    r.send_method(1, rawamqp.BASIC_QOS, struct.pack(">IHB", 0, 1, 0))
    r.send_method(0, CONNECTION_CLOSE_OK)
    r.read_until_closed(timeout=5)


def test_pika_close_both_sides(connect):
    c = connect()
    ch = c.channel()
    ch.queue_declare("", exclusive=True)
    c.close()
    assert c.is_closed


def test_connection_blocked(external_broker, tmp_path):
    """connection.blocked needs a resource alarm.  RabbitMQ offers no client-side trigger, so this
    runs only against a TrioMQ started here with a tiny --memory-limit (always above the limit)."""
    if external_broker:
        pytest.skip("connection.blocked needs a memory/disk alarm; no portable client-side trigger "
                    "exists for an external broker such as RabbitMQ")
    from conftest import start_triomq

    with start_triomq(tmp_path / "blocked-data", ["--memory-limit", "1"]) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                           blocked_connection_timeout=None)
        c = pika.BlockingConnection(params)
        try:
            blocked = []
            c.add_on_connection_blocked_callback(lambda conn, frame: blocked.append(frame.method.reason))
            ch = c.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", q, b"x")  # RabbitMQ blocks a connection once it publishes
            deadline = time.monotonic() + 15
            while not blocked and time.monotonic() < deadline:
                c.process_data_events(time_limit=0.1)
            assert blocked == ["low on memory"]
        finally:
            # the alarm never clears here (--memory-limit 1) and a publisher blocked by an
            # alarm is not read, as on RabbitMQ: a connection.close would wait for a
            # close-ok that cannot come, so the socket is dropped instead
            c._impl._transport.abort()
