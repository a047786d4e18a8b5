"""ServerConnection state machine: handshake, channels, content, closes."""
from __future__ import annotations

import struct

import pytest

from broker.amqp import spec
from broker.amqp.codec import HEARTBEAT_FRAME
from broker.amqp.events import (
    AuthenticationFailed,
    ChannelClosedByPeer,
    ChannelOpened,
    ConnectionCloseCompleted,
    ConnectionClosedByPeer,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
    ProtocolError,
    State,
)
from broker.amqp.fields import encode_properties

from .sansio_helpers import (
    GUEST_AMQPLAIN,
    HEADER,
    REFUSED,
    FakeAuth,
    assert_connection_closed_with,
    body_frame,
    conn_open,
    drain_methods,
    header_frame,
    heartbeat_frame,
    make_conn,
    mframe,
    only_method,
    open_connection,
    parse_frames,
    publish,
    raw_frame,
    start_ok,
    tune_ok,
)


def kinds(events):
    return [type(e) for e in events]


# ---- protocol header -----------------------------------------------------------

def test_header_answered_with_connection_start():
    conn = make_conn()
    assert conn.state is State.AWAIT_HEADER
    assert conn.receive_data(HEADER) == []
    assert conn.state is State.AWAIT_START_OK
    ch, start = only_method(conn)
    assert ch == 0
    assert isinstance(start, spec.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) == {b"PLAIN", b"AMQPLAIN"}
    assert start.locales == b"en_US"
    props = start.server_properties
    assert props["product"] == b"TrioMQ"
    assert props["capabilities"]["publisher_confirms"] is True
    assert props["capabilities"]["authentication_failure_close"] is True


def test_server_properties_override():
    conn = make_conn(server_properties={"cluster_name": "mine", "capabilities": {"x": 1}})
    conn.receive_data(HEADER)
    props = only_method(conn)[1].server_properties
    assert props["cluster_name"] == b"mine"
    assert "x" not in props["capabilities"]  # capabilities are the server's own


@pytest.mark.parametrize("split", range(1, 8))
def test_header_split_across_feeds(split):
    conn = make_conn()
    assert conn.receive_data(HEADER[:split]) == []
    assert conn.state is State.AWAIT_HEADER
    assert conn.data_to_send() == b""
    conn.receive_data(HEADER[split:])
    assert conn.state is State.AWAIT_START_OK
    assert isinstance(only_method(conn)[1], spec.Connection.Start)


def test_header_fed_bytewise_then_handshake_in_one_feed():
    conn = make_conn()
    for b in HEADER:
        conn.receive_data(bytes([b]))
    assert conn.state is State.AWAIT_START_OK
    conn.data_to_send()
    events = conn.receive_data(start_ok() + tune_ok() + conn_open())
    assert kinds(events) == [ConnectionOpened]
    assert conn.state is State.OPEN


def test_header_and_whole_handshake_in_one_feed():
    conn = make_conn()
    events = conn.receive_data(HEADER + start_ok() + tune_ok() + conn_open() + mframe(1, spec.Channel.Open()))
    assert kinds(events) == [ConnectionOpened, ChannelOpened]
    methods = [type(m) for _, m in drain_methods(conn)]
    assert methods == [spec.Connection.Start, spec.Connection.Tune, spec.Connection.OpenOk,
                       spec.Channel.OpenOk]


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x08\x00",  # 0-8
    b"AMQP\x01\x01\x00\x0a",  # 0-10
    b"AMQP\x00\x01\x00\x00",  # 1.0
    b"GET / HTTP/1.1\r\n\r\n",
    b"HTTP",  # shorter than a header but already wrong
    b"\x00",
])
def test_wrong_protocol_header(header):
    conn = make_conn()
    events = conn.receive_data(header)
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert conn.state is State.CLOSED
    assert kinds(events) == [ProtocolError, ConnectionCloseCompleted]
    # Nothing more is read or written.
    assert conn.receive_data(HEADER + start_ok()) == []
    assert conn.data_to_send() == b""


def test_wrong_header_split_across_feeds():
    conn = make_conn()
    assert conn.receive_data(b"AMQP\x00") == []
    events = conn.receive_data(b"\x00\x08\x00")
    assert conn.data_to_send() == HEADER
    assert conn.state is State.CLOSED
    assert ConnectionCloseCompleted in kinds(events)


def test_server_close_before_header_just_closes():
    conn = make_conn()
    conn.close(320, "CONNECTION_FORCED - shutdown")
    assert conn.state is State.CLOSED
    assert conn.data_to_send() == b""


# ---- start / start-ok ------------------------------------------------------------

def _started(**kwargs):
    conn = make_conn(**kwargs)
    conn.receive_data(HEADER)
    conn.data_to_send()
    return conn


@pytest.mark.parametrize("mechanism,response", [("PLAIN", b"\x00guest\x00guest"),
                                                ("AMQPLAIN", GUEST_AMQPLAIN)])
def test_start_ok_accepted_sends_tune(mechanism, response):
    auth = FakeAuth()
    conn = _started(authenticate=auth)
    events = conn.receive_data(start_ok(mechanism, response, capabilities={"connection.blocked": True}))
    assert events == []
    assert auth.calls == [(mechanism, response)]
    assert conn.state is State.AWAIT_TUNE_OK
    assert conn.username == "guest"
    assert conn.client_properties["product"] == b"unit-test"
    assert conn.client_capabilities == {"connection.blocked": True}
    ch, tune = only_method(conn)
    assert ch == 0 and tune == spec.Connection.Tune(2047, 131072, 60)


def test_tune_reflects_server_limits():
    conn = _started(frame_max=8192, channel_max=10, heartbeat=5)
    conn.receive_data(start_ok())
    assert only_method(conn)[1] == spec.Connection.Tune(10, 8192, 5)


@pytest.mark.parametrize("mechanism,response", [("PLAIN", b"\x00guest\x00wrong"),
                                                ("AMQPLAIN", b"garbage"),
                                                ("EXTERNAL", b"")])
def test_auth_failure_without_capability_drops_connection(mechanism, response):
    conn = _started()
    events = conn.receive_data(start_ok(mechanism, response))
    assert kinds(events) == [AuthenticationFailed, ConnectionCloseCompleted]
    assert events[0].reply_text == REFUSED
    assert conn.state is State.CLOSED
    assert conn.data_to_send() == b""


def test_auth_failure_with_capability_sends_403_then_waits_for_close_ok():
    conn = _started()
    events = conn.receive_data(start_ok(response=b"\x00guest\x00nope",
                                        capabilities={"authentication_failure_close": True}))
    assert kinds(events) == [AuthenticationFailed]
    close = assert_connection_closed_with(conn, spec.ACCESS_REFUSED, 0, 0)
    assert close.reply_text == REFUSED
    assert conn.state is State.CLOSING
    # Anything but close-ok is ignored.
    assert conn.receive_data(tune_ok() + conn_open()) == []
    assert conn.data_to_send() == b""
    events = conn.receive_data(mframe(0, spec.Connection.CloseOk()))
    assert kinds(events) == [ConnectionCloseCompleted]
    assert conn.state is State.CLOSED


def test_auth_failure_with_custom_authenticator_text():
    conn = _started(authenticate=lambda m, r: (None, "go away"))
    conn.receive_data(start_ok(capabilities={"authentication_failure_close": True}))
    assert assert_connection_closed_with(conn, 403).reply_text == "ACCESS_REFUSED - go away"


def test_auth_failure_without_text_drops_even_with_capability():
    # A malformed response: RabbitMQ drops the socket without a connection.close.
    conn = _started(authenticate=lambda m, r: (None, ""))
    events = conn.receive_data(start_ok(capabilities={"authentication_failure_close": True}))
    assert kinds(events) == [AuthenticationFailed, ConnectionCloseCompleted]
    assert conn.state is State.CLOSED
    assert conn.data_to_send() == b""


def test_client_capabilities_not_a_table_are_ignored():
    conn = _started()
    conn.receive_data(mframe(0, spec.Connection.StartOk({"capabilities": b"nope"}, "PLAIN",
                                                         b"\x00guest\x00guest", "en_US")))
    assert conn.client_capabilities == {}
    assert conn.state is State.AWAIT_TUNE_OK


# ---- tune / tune-ok ------------------------------------------------------------

def _tuning(**kwargs):
    conn = _started(**kwargs)
    conn.receive_data(start_ok())
    conn.data_to_send()
    return conn


def test_tune_ok_accepted():
    conn = _tuning()
    assert conn.receive_data(tune_ok(100, 65536, 30)) == []
    assert conn.state is State.AWAIT_OPEN
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (100, 65536, 30)
    assert conn.data_to_send() == b""
    # The reader now enforces the negotiated frame_max (with RabbitMQ's 8-octet allowance).
    conn.receive_data(raw_frame(1, 0, b"\x00" * 65537))
    assert_connection_closed_with(conn, spec.FRAME_ERROR)
    assert conn.state is State.CLOSED


def test_tune_ok_zero_means_server_limits():
    conn = _tuning()
    conn.receive_data(tune_ok(0, 0, 0))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (2047, 131072, 0)


@pytest.mark.parametrize("frame_max", [1, 4095])
def test_tune_ok_frame_max_too_small(frame_max):
    conn = _tuning()
    events = conn.receive_data(tune_ok(frame_max=frame_max))
    assert kinds(events) == [ProtocolError]
    close = assert_connection_closed_with(conn, spec.NOT_ALLOWED, 10, 31)
    assert str(frame_max) in close.reply_text
    assert conn.state is State.CLOSING


def test_tune_ok_frame_max_minimum_is_fine():
    conn = _tuning()
    conn.receive_data(tune_ok(frame_max=4096))
    assert conn.state is State.AWAIT_OPEN and conn.frame_max == 4096


@pytest.mark.parametrize("frame_max", [131073, 2**32 - 1])
def test_tune_ok_frame_max_too_big(frame_max):
    conn = _tuning()
    conn.receive_data(tune_ok(frame_max=frame_max))
    assert_connection_closed_with(conn, spec.NOT_ALLOWED, 10, 31)


def test_tune_ok_channel_max_too_big():
    conn = _tuning()
    conn.receive_data(tune_ok(channel_max=2048))
    assert_connection_closed_with(conn, spec.NOT_ALLOWED, 10, 31)


# ---- open / open-ok --------------------------------------------------------------

def _opening(**kwargs):
    conn = _tuning(**kwargs)
    conn.receive_data(tune_ok())
    return conn


def test_open_known_vhost():
    conn = _opening(vhosts={"/", "prod"})
    events = conn.receive_data(conn_open("prod"))
    assert events == [ConnectionOpened("prod", "guest", {"product": b"unit-test"})]
    assert conn.state is State.OPEN and conn.is_open and conn.vhost == "prod"
    ch, ok = only_method(conn)
    assert ch == 0 and isinstance(ok, spec.Connection.OpenOk)


def test_open_unknown_vhost():
    conn = _opening()
    events = conn.receive_data(conn_open("nope"))
    assert kinds(events) == [ProtocolError]
    close = assert_connection_closed_with(conn, spec.NOT_ALLOWED, 10, 40)
    assert "nope" in close.reply_text
    assert not conn.is_open


def test_open_unknown_vhost_with_long_multibyte_name():
    # The reply text embeds the vhost; it must still fit a shortstr.
    conn = _opening()
    vhost = "é" * 127
    conn.receive_data(conn_open(vhost))
    close = assert_connection_closed_with(conn, spec.NOT_ALLOWED, 10, 40)
    assert len(close.reply_text.encode()) <= 255


def test_open_unknown_vhost_with_invalid_utf8_name():
    conn = _opening()
    payload = struct.pack(">HH", 10, 40) + b"\x02\xff\xfe\x00\x00"
    conn.receive_data(raw_frame(1, 0, payload))
    close = assert_connection_closed_with(conn, spec.FRAME_ERROR, 10, 40)
    assert close.reply_text == "FRAME_ERROR - Malformed UTF-8 in shortstr"


@pytest.mark.parametrize("stage,frame", [
    ("start_ok", tune_ok()),
    ("start_ok", conn_open()),
    ("tune_ok", start_ok()),
    ("tune_ok", conn_open()),
    ("open", tune_ok()),
    ("open", mframe(0, spec.Queue.Declare())),
    ("open", mframe(1, spec.Channel.Open())),
    ("open", heartbeat_frame(0) + header_frame(0, 0)),
    ("open", body_frame(0, b"x")),
])
def test_handshake_out_of_order(stage, frame):
    conn = {"start_ok": _started, "tune_ok": _tuning, "open": _opening}[stage]()
    conn.data_to_send()
    events = conn.receive_data(frame)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.COMMAND_INVALID)


@pytest.mark.parametrize("stage", ["start_ok", "tune_ok", "open"])
def test_client_close_during_handshake(stage):
    conn = {"start_ok": _started, "tune_ok": _tuning, "open": _opening}[stage]()
    conn.data_to_send()
    events = conn.receive_data(mframe(0, spec.Connection.Close(200, "never mind", 0, 0)))
    assert events == [ConnectionClosedByPeer(200, "never mind")]
    assert conn.state is State.CLOSED
    assert conn.data_to_send() == b""  # the broker answers, once it has written what it owes
    conn.accept_close()
    assert isinstance(only_method(conn)[1], spec.Connection.CloseOk)
    assert conn.linger_for_eof


def test_heartbeats_allowed_during_handshake():
    conn = _tuning()
    assert conn.receive_data(HEARTBEAT_FRAME * 3) == []
    assert conn.state is State.AWAIT_TUNE_OK


# ---- channels ------------------------------------------------------------------

def test_channel_open():
    conn = open_connection()
    events = conn.receive_data(mframe(3, spec.Channel.Open()))
    assert events == [ChannelOpened(3)]
    ch, ok = only_method(conn)
    assert ch == 3 and isinstance(ok, spec.Channel.OpenOk)
    assert conn.channel_is_open(3) and not conn.channel_is_open(4)


def test_channel_open_above_channel_max():
    conn = make_conn()
    conn.receive_data(HEADER + start_ok() + tune_ok(channel_max=5) + conn_open())
    conn.data_to_send()
    conn.receive_data(mframe(5, spec.Channel.Open()))
    assert conn.channel_is_open(5)
    conn.data_to_send()
    conn.receive_data(mframe(6, spec.Channel.Open()))
    assert_connection_closed_with(conn, spec.CHANNEL_ERROR, 20, 10)


def test_second_channel_open_is_504():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Channel.Open()))
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.CHANNEL_ERROR, 20, 10)


@pytest.mark.parametrize("frame", [
    mframe(2, spec.Queue.Declare(queue="q")),
    mframe(2, spec.Channel.Close(200, "", 0, 0)),
    mframe(2, spec.Basic.Publish()),
    header_frame(2, 0),
    body_frame(2, b"x"),
])
def test_frames_on_unopened_channel_are_504(frame):
    conn = open_connection(channels=[1])
    events = conn.receive_data(frame)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.CHANNEL_ERROR)


def test_method_received_on_open_channel():
    conn = open_connection(channels=[1])
    m = spec.Queue.Declare(0, "q", False, True, False, False, False, {"x-max-length": 10})
    events = conn.receive_data(mframe(1, m))
    assert events == [MethodReceived(1, m)]
    assert conn.data_to_send() == b""


def test_client_closes_channel():
    conn = open_connection(channels=[1, 2])
    events = conn.receive_data(mframe(1, spec.Channel.Close(200, "bye", 0, 0)))
    assert events == [ChannelClosedByPeer(1, 200, "bye")]
    # The broker answers after writing what it still owes on the channel (confirms).
    assert conn.data_to_send() == b""
    conn.accept_channel_close(1)
    ch, ok = only_method(conn)
    assert ch == 1 and isinstance(ok, spec.Channel.CloseOk)
    assert not conn.channel_is_open(1) and conn.channel_is_open(2)
    # The channel number can be reused.
    assert conn.receive_data(mframe(1, spec.Channel.Open())) == [ChannelOpened(1)]


def test_unsolicited_channel_close_ok_is_ignored():
    conn = open_connection(channels=[1])
    assert conn.receive_data(mframe(1, spec.Channel.CloseOk())) == []
    assert conn.channel_is_open(1)
    assert conn.data_to_send() == b""


@pytest.mark.parametrize("answer,written", [
    (spec.Channel.CloseOk(), []),
    (spec.Channel.Close(200, "crossing", 0, 0), [spec.Channel.CloseOk]),
])
def test_server_closes_channel(answer, written):
    conn = open_connection(channels=[1, 2])
    conn.close_channel(1, spec.PRECONDITION_FAILED, "PRECONDITION_FAILED - inequivalent arg", 50, 10)
    ch, close = only_method(conn)
    assert ch == 1 and close == spec.Channel.Close(406, "PRECONDITION_FAILED - inequivalent arg", 50, 10)
    assert not conn.channel_is_open(1)
    # Everything on the closing channel is discarded until close-ok.
    discarded = (mframe(1, spec.Queue.Declare(queue="q")) + publish(1, b"body", chunks=2)
                 + header_frame(1, 3) + body_frame(1, b"abc") + mframe(1, spec.Channel.Open())
                 + mframe(1, spec.Basic.Deliver()) + raw_frame(1, 1, struct.pack(">HH", 60, 999)))
    assert conn.receive_data(discarded) == []
    assert conn.data_to_send() == b""
    assert conn.state is State.OPEN
    # Other channels keep working meanwhile.
    assert kinds(conn.receive_data(mframe(2, spec.Basic.Qos(0, 10, False)))) == [MethodReceived]
    assert conn.receive_data(mframe(1, answer)) == []
    assert [type(m) for _, m in drain_methods(conn)] == written
    assert 1 not in conn.channels
    assert conn.receive_data(mframe(1, spec.Channel.Open())) == [ChannelOpened(1)]


def test_close_channel_twice_or_unknown_is_noop():
    conn = open_connection(channels=[1])
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.close_channel(1, 406, "PRECONDITION_FAILED - again")
    conn.close_channel(9, 406, "PRECONDITION_FAILED - unknown")
    assert len(drain_methods(conn)) == 1


def test_close_channel_text_truncated_to_shortstr():
    conn = open_connection(channels=[1])
    conn.close_channel(1, 404, "NOT_FOUND - " + "ü" * 300)
    close = only_method(conn)[1]
    assert len(close.reply_text.encode()) <= 255


def test_server_close_channel_mid_content_discards_rest():
    conn = open_connection(channels=[1])
    conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 10))
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert conn.receive_data(body_frame(1, b"0123456789")) == []
    conn.receive_data(mframe(1, spec.Channel.CloseOk()))
    conn.receive_data(mframe(1, spec.Channel.Open()))
    events = conn.receive_data(publish(1, b"new"))
    assert [e.body for e in events] == [b"new"]


# ---- content assembly ------------------------------------------------------------

def test_publish_single_body_frame():
    conn = open_connection(channels=[1])
    props = {"content_type": "text/plain", "delivery_mode": 2, "headers": {"k": "v"}}
    data = (mframe(1, spec.Basic.Publish(0, "amq.topic", "a.b", True, False))
            + header_frame(1, 5, props) + body_frame(1, b"hello"))
    events = conn.receive_data(data)
    assert events == [ContentReceived(1, "amq.topic", "a.b", True, False, encode_properties(props),
                                      {"content_type": "text/plain", "delivery_mode": 2,
                                       "headers": {"k": b"v"}}, b"hello")]
    assert conn.data_to_send() == b""


def test_publish_flags():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish(0, "", "q", False, True))
                               + header_frame(1, 0))
    assert (events[0].mandatory, events[0].immediate) == (False, True)


@pytest.mark.parametrize("chunks", [2, 3, 7, 100])
def test_publish_multi_frame_body(chunks):
    conn = open_connection(channels=[1])
    body = bytes(range(256)) * 4
    events = conn.receive_data(publish(1, body, chunks=chunks))
    assert len(events) == 1 and events[0].body == body


def test_publish_body_fed_bytewise():
    conn = open_connection(channels=[1])
    data = publish(1, b"x" * 50, chunks=5) + publish(1, b"", routing_key="second")
    events = []
    for i in range(len(data)):
        events += conn.receive_data(data[i:i + 1])
    assert [(e.routing_key, e.body) for e in events] == [("rk", b"x" * 50), ("second", b"")]


def test_zero_length_body_completes_on_header():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish(0, "", "q", False, False))
                               + header_frame(1, 0, {"message_id": "m1"}))
    assert len(events) == 1
    assert events[0].body == b"" and events[0].properties == {"message_id": "m1"}
    # Next method is accepted straight away (no body frame expected).
    assert kinds(conn.receive_data(mframe(1, spec.Basic.Qos()))) == [MethodReceived]


def test_empty_body_frames_are_tolerated():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 3)
                               + body_frame(1, b"") + body_frame(1, b"abc"))
    assert events[0].body == b"abc"


def test_interleaved_content_on_two_channels():
    conn = open_connection(channels=[1, 2])
    data = (mframe(1, spec.Basic.Publish(0, "", "one")) + mframe(2, spec.Basic.Publish(0, "", "two"))
            + header_frame(2, 2) + header_frame(1, 2) + body_frame(1, b"1a") + body_frame(2, b"2a")
            + HEARTBEAT_FRAME)
    events = conn.receive_data(data)
    assert [(e.channel, e.routing_key, e.body) for e in events] == [(1, "one", b"1a"), (2, "two", b"2a")]


def test_heartbeat_in_the_middle_of_content():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + HEARTBEAT_FRAME + header_frame(1, 2)
                               + HEARTBEAT_FRAME + body_frame(1, b"ok"))
    assert events[0].body == b"ok"


@pytest.mark.parametrize("frame", [header_frame(1, 3), body_frame(1, b"abc")])
def test_content_frame_without_method_is_505(frame):
    conn = open_connection(channels=[1])
    events = conn.receive_data(frame)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME)


def test_body_longer_than_declared_closes_connection():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 3) + body_frame(1, b"abcd"))
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME, 60, 40)


def test_body_overrun_across_frames():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 3) + body_frame(1, b"ab")
                               + body_frame(1, b"cd"))
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME)


@pytest.mark.parametrize("frame", [mframe(1, spec.Basic.Qos()), body_frame(1, b"x"),
                                   mframe(1, spec.Basic.Publish())])
def test_expecting_header_gets_something_else_505(frame):
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + frame)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME, 60, 40)


@pytest.mark.parametrize("frame", [mframe(1, spec.Basic.Qos()), header_frame(1, 3)])
def test_expecting_body_gets_something_else_505(frame):
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 3) + frame)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME, 60, 40)


def test_content_header_for_wrong_class_505():
    conn = open_connection(channels=[1])
    conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 0, class_id=50))
    close = assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME)
    assert "class 50" in close.reply_text


def test_content_header_too_short_is_frame_error():
    conn = open_connection(channels=[1])
    conn.receive_data(mframe(1, spec.Basic.Publish()) + raw_frame(2, 1, b"\x00\x3c\x00"))
    assert_connection_closed_with(conn, spec.FRAME_ERROR)


@pytest.mark.parametrize("props_raw", [b"\x80\x00\x09abc", b"\x00\x00trailing", b"\x00\x01", b"\x00"])
def test_malformed_properties_502(props_raw):
    conn = open_connection(channels=[1])
    header = raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + props_raw)
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header)
    assert kinds(events) == [ProtocolError]
    assert_connection_closed_with(conn, spec.SYNTAX_ERROR, 60, 40)


def test_message_larger_than_max_message_size_closes_channel():
    conn = open_connection(channels=[1], max_message_size=10)
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 11)
                               + body_frame(1, b"x" * 11))
    assert events == []
    ch, close = only_method(conn)
    assert ch == 1 and close.reply_code == spec.PRECONDITION_FAILED
    assert (close.class_id, close.method_id) == (60, 40)
    assert conn.state is State.OPEN
    conn.receive_data(mframe(1, spec.Channel.CloseOk()) + mframe(1, spec.Channel.Open()))
    events = conn.receive_data(publish(1, b"x" * 10))
    assert [e.body for e in events if isinstance(e, ContentReceived)] == [b"x" * 10]


@pytest.mark.parametrize("payload", [
    struct.pack(">HH", 60, 40),  # no arguments at all
    struct.pack(">HHH", 60, 40, 0) + b"\x05ab",  # exchange overrun
    struct.pack(">HHH", 60, 40, 0) + b"\x00\x05ab\x00",  # routing key overrun
    struct.pack(">HHH", 60, 40, 0) + b"\x00\x00",  # bits missing
])
def test_malformed_publish_502(payload):
    conn = open_connection(channels=[1])
    conn.receive_data(raw_frame(1, 1, payload))
    assert_connection_closed_with(conn, spec.SYNTAX_ERROR)


@pytest.mark.parametrize("method", [spec.Basic.Deliver(), spec.Basic.Return(), spec.Basic.GetOk()])
def test_server_only_content_methods_from_client_503(method):
    conn = open_connection(channels=[1])
    conn.receive_data(mframe(1, method))
    assert_connection_closed_with(conn, spec.COMMAND_INVALID, method.CLASS_ID, method.METHOD_ID)


# ---- connection-level errors ---------------------------------------------------

@pytest.mark.parametrize("channel", [0, 1])
@pytest.mark.parametrize("class_id,method_id,code", [
    (60, 999, spec.COMMAND_INVALID),  # known class, unknown method
    (10, 12, spec.COMMAND_INVALID),
    (77, 10, spec.NOT_IMPLEMENTED),  # unknown class
    (0, 0, spec.NOT_IMPLEMENTED),
])
def test_unknown_method(channel, class_id, method_id, code):
    conn = open_connection(channels=[1])
    events = conn.receive_data(raw_frame(1, channel, struct.pack(">HH", class_id, method_id)))
    assert kinds(events) == [ProtocolError]
    close = assert_connection_closed_with(conn, code)
    assert f"class {class_id}, method {method_id}" in close.reply_text


@pytest.mark.parametrize("payload,ids", [
    (b"\x00\x32", (0, 0)),  # shorter than class+method
    (struct.pack(">HHH", 50, 10, 0) + b"\x05q", (50, 10)),  # queue.declare truncated
    (struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + struct.pack(">I", 99), (50, 10)),  # table overrun
    (struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + struct.pack(">I", 3) + b"\x01kZ", (50, 10)),  # bad tag
    (struct.pack(">HH", 60, 80) + b"\x00\x00", (60, 80)),  # basic.ack truncated
    (spec.Basic.Ack(1, False).encode() + b"\x00", (60, 80)),  # trailing octet
])
def test_malformed_method_is_frame_error(payload, ids):
    # RabbitMQ answers an undecodable method with 501 "FRAME_ERROR - cannot decode <<...>>".
    conn = open_connection(channels=[1])
    events = conn.receive_data(raw_frame(1, 1, payload))
    assert kinds(events) == [ProtocolError]
    close = assert_connection_closed_with(conn, spec.FRAME_ERROR, *ids)
    assert close.reply_text.startswith("FRAME_ERROR - cannot decode <<")


def test_malformed_method_text_shows_the_arguments():
    conn = open_connection(channels=[1])
    conn.receive_data(raw_frame(1, 1, struct.pack(">HH", 60, 80) + b"\x00\x01"))
    close = assert_connection_closed_with(conn, spec.FRAME_ERROR, 60, 80)
    assert close.reply_text == "FRAME_ERROR - cannot decode <<0,1>>"


def test_deeply_nested_arguments_are_accepted():
    # RabbitMQ accepts arguments nested as deep as the frame holds (18,000 levels in
    # 128 KiB); TrioMQ closed the connection with 502 past 100 levels
    conn = open_connection(channels=[1])
    inner = struct.pack(">I", 0)
    for _ in range(18_000):
        body = b"A" + inner
        inner = struct.pack(">I", len(body)) + body
    args = struct.pack(">I", len(inner) + 3) + b"\x01kA" + inner
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + args
    events = conn.receive_data(raw_frame(1, 1, payload))
    assert kinds(events) == [MethodReceived]
    value, depth = events[0].method.arguments["k"], 0
    while value:
        value, depth = value[0], depth + 1
    assert depth == 18_000


def test_heartbeat_on_channel_zero_is_fine():
    conn = open_connection()
    assert conn.receive_data(HEARTBEAT_FRAME) == []
    assert conn.data_to_send() == b""
    assert conn.is_open


@pytest.mark.parametrize("channel", [1, 7])
def test_heartbeat_on_non_zero_channel(channel):
    # RabbitMQ: 505 "UNEXPECTED_FRAME - type 8, all octets = <<>>" (the brief said 501).
    conn = open_connection(channels=[1])
    events = conn.receive_data(heartbeat_frame(channel))
    assert kinds(events) == [ProtocolError]
    close = assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME)
    assert close.reply_text == "UNEXPECTED_FRAME - type 8, all octets = <<>>"


@pytest.mark.parametrize("frame", [header_frame(0, 0), body_frame(0, b"x")])
def test_content_frame_on_channel_zero_505(frame):
    conn = open_connection()
    conn.receive_data(frame)
    assert_connection_closed_with(conn, spec.UNEXPECTED_FRAME)


@pytest.mark.parametrize("channel", [0, 1, 5])
@pytest.mark.parametrize("ftype", [0, 4, 7, 9, 255])
def test_unknown_frame_type_501(ftype, channel):
    conn = open_connection(channels=[1])
    conn.receive_data(raw_frame(ftype, channel, b"???"))
    close = assert_connection_closed_with(conn, spec.FRAME_ERROR)
    assert close.reply_text == f'FRAME_ERROR - type {ftype}, all octets = <<"???">>: unknown_frame'


@pytest.mark.parametrize("method", [spec.Connection.Open(), spec.Connection.StartOk(),
                                    spec.Connection.TuneOk(), spec.Connection.Start()])
def test_unexpected_connection_method_on_open_connection_503(method):
    conn = open_connection()
    conn.receive_data(mframe(0, method))
    assert_connection_closed_with(conn, spec.COMMAND_INVALID, method.CLASS_ID, method.METHOD_ID)


@pytest.mark.parametrize("method", [spec.Channel.Open(), spec.Queue.Declare(), spec.Basic.Qos()])
def test_non_connection_method_on_channel_zero_504(method):
    conn = open_connection()
    conn.receive_data(mframe(0, method))
    assert_connection_closed_with(conn, spec.CHANNEL_ERROR, method.CLASS_ID, method.METHOD_ID)


def test_update_secret_and_blocked_from_client():
    conn = open_connection()
    assert conn.receive_data(mframe(0, spec.Connection.UpdateSecret(b"tok", "refresh"))) == []
    assert isinstance(only_method(conn)[1], spec.Connection.UpdateSecretOk)
    assert conn.receive_data(mframe(0, spec.Connection.Blocked("x"))
                             + mframe(0, spec.Connection.Unblocked())) == []
    assert conn.data_to_send() == b"" and conn.is_open


def test_blocked_notifications_need_the_capability():
    conn = open_connection()
    assert conn.send_blocked("low memory") is False
    assert conn.send_unblocked() is False
    assert conn.data_to_send() == b""
    conn = make_conn()
    conn.receive_data(HEADER + start_ok(capabilities={"connection.blocked": True}) + tune_ok() + conn_open())
    conn.data_to_send()
    assert conn.send_blocked("low memory") is True
    assert conn.send_unblocked() is True
    assert [m for _, m in drain_methods(conn)] == [spec.Connection.Blocked("low memory"),
                                                   spec.Connection.Unblocked()]


def test_only_one_close_for_several_errors_in_a_batch():
    conn = open_connection(channels=[1])
    events = conn.receive_data(heartbeat_frame(1) + body_frame(5, b"x") + mframe(1, spec.Channel.Open()))
    assert kinds(events) == [ProtocolError]
    closes = [m for _, m in drain_methods(conn) if isinstance(m, spec.Connection.Close)]
    assert len(closes) == 1 and closes[0].reply_code == spec.UNEXPECTED_FRAME


# ---- connection close ----------------------------------------------------------

def test_client_close():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(0, spec.Connection.Close(200, "Goodbye", 0, 0)))
    assert events == [ConnectionClosedByPeer(200, "Goodbye")]
    assert conn.state is State.CLOSED
    assert conn.data_to_send() == b""
    conn.accept_close()
    ch, ok = only_method(conn)
    assert ch == 0 and isinstance(ok, spec.Connection.CloseOk)
    assert conn.receive_data(publish(1, b"late") + HEARTBEAT_FRAME) == []
    assert conn.data_to_send() == b""


def test_client_close_then_more_frames_in_same_feed():
    conn = open_connection(channels=[1])
    events = conn.receive_data(mframe(0, spec.Connection.Close(320, "x", 0, 0)) + publish(1, b"late"))
    assert events == [ConnectionClosedByPeer(320, "x")]
    conn.accept_close()
    assert [type(m) for _, m in drain_methods(conn)] == [spec.Connection.CloseOk]


@pytest.mark.parametrize("answer,written", [
    (spec.Connection.CloseOk(), []),
    (spec.Connection.Close(200, "crossing", 0, 0), [spec.Connection.CloseOk]),
])
def test_server_close(answer, written):
    conn = open_connection(channels=[1])
    conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 4))
    conn.close(spec.CONNECTION_FORCED, "CONNECTION_FORCED - broker shutdown")
    assert conn.state is State.CLOSING and not conn.is_open
    close = assert_connection_closed_with(conn, spec.CONNECTION_FORCED, 0, 0)
    assert close.reply_text == "CONNECTION_FORCED - broker shutdown"
    ignored = (body_frame(1, b"abcd") + publish(1, b"x") + mframe(2, spec.Channel.Open())
               + mframe(1, spec.Queue.Declare()) + HEARTBEAT_FRAME + mframe(0, spec.Connection.Blocked("x"))
               + raw_frame(1, 0, struct.pack(">HH", 10, 99)) + raw_frame(1, 0, b"\x00\x0a\x00\x0a"))
    assert conn.receive_data(ignored) == []
    assert conn.data_to_send() == b""
    assert conn.state is State.CLOSING
    conn.close(541, "INTERNAL_ERROR - twice")  # already closing: no second close
    assert conn.data_to_send() == b""
    events = conn.receive_data(mframe(0, answer))
    assert events == [ConnectionCloseCompleted()]
    assert conn.state is State.CLOSED
    assert [type(m) for _, m in drain_methods(conn)] == written
    assert conn.receive_data(mframe(0, spec.Connection.CloseOk())) == []


def test_server_close_text_truncated_to_shortstr():
    conn = open_connection()
    conn.close(541, "INTERNAL_ERROR - " + "€" * 200, 60, 40)
    close = assert_connection_closed_with(conn, 541, 60, 40)
    assert len(close.reply_text.encode()) <= 255


def test_close_ok_from_client_while_open():
    conn = open_connection()
    events = conn.receive_data(mframe(0, spec.Connection.CloseOk()))
    assert events == [ConnectionCloseCompleted()]
    assert conn.state is State.CLOSED


# ---- framing errors through the connection ------------------------------------

def test_bad_frame_end_closes_immediately():
    conn = open_connection(channels=[1])
    events = conn.receive_data(raw_frame(1, 1, spec.Basic.Qos().encode(), end=0x00))
    assert kinds(events) == [ProtocolError, ConnectionCloseCompleted]
    assert events[0].reply_code == spec.FRAME_ERROR
    assert_connection_closed_with(conn, spec.FRAME_ERROR)
    assert conn.state is State.CLOSED
    assert conn.receive_data(HEARTBEAT_FRAME) == []


def test_frame_larger_than_negotiated_frame_max():
    conn = make_conn()
    conn.receive_data(HEADER + start_ok() + tune_ok(frame_max=4096) + conn_open()
                      + mframe(1, spec.Channel.Open()))
    conn.data_to_send()
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 5000)
                               + body_frame(1, b"x" * 4097))
    assert kinds(events)[-2:] == [ProtocolError, ConnectionCloseCompleted]
    close = assert_connection_closed_with(conn, spec.FRAME_ERROR)
    assert "frame_too_large,4097,4088" in close.reply_text
    assert conn.state is State.CLOSED


def test_body_frames_of_frame_max_octets_are_accepted():
    # RabbitMQ accepts frame_max + 8 octets a frame (clients that fill a frame with frame_max
    # octets of body); a publish cut that way arrives whole.
    conn = make_conn()
    conn.receive_data(HEADER + start_ok() + tune_ok(frame_max=4096) + conn_open()
                      + mframe(1, spec.Channel.Open()))
    conn.data_to_send()
    events = conn.receive_data(mframe(1, spec.Basic.Publish()) + header_frame(1, 4096 * 2 + 1)
                               + body_frame(1, b"a" * 4096) + body_frame(1, b"b" * 4096)
                               + body_frame(1, b"c"))
    assert ProtocolError not in kinds(events)
    published = [e for e in events if isinstance(e, ContentReceived)]
    assert bytes(published[-1].body) == b"a" * 4096 + b"b" * 4096 + b"c"
    assert conn.state is not State.CLOSED


def test_frames_before_a_framing_error_are_processed():
    conn = open_connection(channels=[1])
    events = conn.receive_data(publish(1, b"first") + raw_frame(3, 1, b"x", end=0x00))
    assert kinds(events) == [ContentReceived, ProtocolError, ConnectionCloseCompleted]
    assert events[0].body == b"first"
    assert not conn.linger_for_eof  # the edge drops the stream at once, no lingering


def test_has_output_counts_frames_not_bytes():
    """A frame list whose byte estimate is 0 (an empty body) still has to be written."""
    conn = open_connection(channels=[1])
    assert not conn.has_output
    conn.write_many([b"frame"], 0)
    assert conn.has_output and conn.pending_output == 0
    assert conn.data_to_send() == b"frame" and not conn.has_output


def test_server_close_answered_by_close_ok_drops_at_once():
    """The peer's close-ok is its last frame: nothing to linger for (RabbitMQ closes at once)."""
    conn = open_connection()
    conn.close(320, "CONNECTION_FORCED - x")
    conn.data_to_send()
    assert conn.receive_data(mframe(0, spec.Connection.CloseOk())) == [ConnectionCloseCompleted()]
    assert conn.state is State.CLOSED
    assert not conn.linger_for_eof


def test_framing_error_after_client_close_in_same_feed():
    conn = open_connection()
    events = conn.receive_data(mframe(0, spec.Connection.Close(200, "bye", 0, 0)) + b"\xff" * 20)
    assert events == [ConnectionClosedByPeer(200, "bye")]
    conn.accept_close()
    assert [type(m) for _, m in drain_methods(conn)] == [spec.Connection.CloseOk]
    assert conn.linger_for_eof


def test_everything_written_is_well_formed():
    conn = make_conn()
    conn.receive_data(HEADER + start_ok() + tune_ok() + conn_open() + mframe(1, spec.Channel.Open()))
    conn.send_heartbeat()
    conn.send_method(1, spec.Basic.ConsumeOk("ctag"))
    assert conn.pending_output > 0
    frames = parse_frames(conn.data_to_send())
    assert conn.pending_output == 0
    assert frames[-2] == (8, 0, b"") and frames[-1][1] == 1
