"""The server side of a Stream-protocol connection, sans-IO: handshake, refusals, close."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.streamproto import codec as c
from broker.streamproto.connection import (
    MAX_UNAUTHENTICATED,
    AuthenticateRequested,
    ClosedByPeer,
    CommandReceived,
    ConnectionClosed,
    OpenRequested,
    ServerConnection,
    State,
)

from .test_codec import SAMPLES


def _frames(conn):
    return [(k, v, bytes(p)) for k, v, p in c.FrameReader(0).feed(conn.data_to_send())]


def _login(conn, vhost="/"):
    ev = conn.receive_data(c.encode(c.PeerProperties(1, {"product": "t"}))
                           + c.encode(c.SaslHandshake(2))
                           + c.encode(c.SaslAuthenticate(3, "PLAIN", b"\0guest\0pw")))
    assert ev == [AuthenticateRequested(3, "PLAIN", "guest", "pw")]
    conn.authenticated(3, "guest")
    out = _frames(conn)
    assert [k for k, _v, _p in out] == [0x8011, 0x8012, 0x8013, c.TUNE]
    assert out[1][2] == struct.pack(">IHi", 2, 1, 1) + b"\x00\x05PLAIN"
    assert out[3][2] == struct.pack(">II", 1048576, 60)
    ev = conn.receive_data(c.encode(c.Tune(500_000, 0)) + c.encode(c.Open(4, vhost)))
    assert ev == [OpenRequested(4, vhost)]
    assert conn.frame_max == 500_000 and conn.heartbeat == 60
    conn.open_ok(4, vhost, {"advertised_host": "h", "advertised_port": "1"})
    (key, _v, p), = _frames(conn)
    assert key == 0x8015 and p[:6] == struct.pack(">IH", 4, c.OK)
    assert conn.state is State.OPEN


def test_handshake_and_commands():
    conn = ServerConnection()
    _login(conn)
    ev = conn.receive_data(c.encode(c.Heartbeat()) + c.encode(c.Delete(5, "s")))
    assert ev == [CommandReceived(c.Delete(5, "s"))]
    ev = conn.receive_data(c.encode(c.Close(6, 1, "bye")))
    assert ev == [ClosedByPeer(6, 1, "bye")]
    conn.accept_close(6)
    assert _frames(conn) == [(0x8016, 1, struct.pack(">IH", 6, 1))]
    assert conn.state is State.CLOSED


def test_exchange_command_versions_answered_and_remembered():
    conn = ServerConnection()
    _login(conn)
    assert conn.deliver_version == 1
    conn.receive_data(c.encode(c.ExchangeCommandVersions(7, [(c.DELIVER, 1, 2)])))
    (key, _v, p), = _frames(conn)
    versions = c.decode(c.EXCHANGE_COMMAND_VERSIONS, 1, struct.pack(">I", 7) + p[6:]).versions
    assert (c.PUBLISH, 1, 2) in versions and (c.DELIVER, 1, 2) in versions
    assert conn.deliver_version == 2


def test_other_mechanisms_refused():
    for mech in ("AMQPLAIN", "EXTERNAL"):
        conn = ServerConnection()
        ev = conn.receive_data(c.encode(c.PeerProperties(1, {}))
                               + c.encode(c.SaslAuthenticate(3, mech, b"x")))
        assert isinstance(ev[-1], ConnectionClosed)
        assert _frames(conn)[-1] == (0x8013, 1, struct.pack(">IH", 3,
                                                           c.SASL_MECHANISM_NOT_SUPPORTED))
    conn = ServerConnection()
    ev = conn.receive_data(c.encode(c.PeerProperties(1, {}))
                           + c.encode(c.SaslAuthenticate(3, "PLAIN", b"no-nul")))
    assert ev[-1].code == c.SASL_ERROR


def test_refused_login_and_vhost():
    conn = ServerConnection()
    conn.receive_data(c.encode(c.PeerProperties(1, {}))
                      + c.encode(c.SaslAuthenticate(3, "PLAIN", b"\0u\0p")))
    conn.refuse_login(3)
    assert _frames(conn)[-1] == (0x8013, 1, struct.pack(">IH", 3, c.AUTHENTICATION_FAILURE))
    assert conn.state is State.CLOSED
    assert conn.receive_data(c.encode(c.Open(4, "/"))) == []


def test_unexpected_frame_before_open_ends_silently():
    conn = ServerConnection()
    ev = conn.receive_data(c.encode(c.Delete(1, "s")))
    assert ev == [ConnectionClosed(c.UNKNOWN_FRAME, "unexpected Delete in state PEER_PROPERTIES")]
    assert conn.data_to_send() == b""


def test_before_login_a_frame_is_bounded():
    conn = ServerConnection()
    ev = conn.receive_data(struct.pack(">IHH", MAX_UNAUTHENTICATED + 1, c.PEER_PROPERTIES, 1))
    assert ev == [ConnectionClosed(c.FRAME_TOO_LARGE, ev[0].reason)]
    assert conn.data_to_send() == b""


def test_after_open_bad_frames_close_with_the_code():
    for data, code, reason in [
        (struct.pack(">IHH", 4, 0x63, 1), c.UNKNOWN_FRAME, "unknown frame"),
        (struct.pack(">IHHI", 8, c.DELETE, 9, 11), c.UNKNOWN_FRAME, "unknown frame"),
        (struct.pack(">IHHI", 8, c.DELETE, 1, 11), c.UNKNOWN_FRAME, "unknown frame"),
        (struct.pack(">IHH", 500_001, c.PUBLISH, 1) + bytes(499_997), c.FRAME_TOO_LARGE, "frame too large"),
        (c.encode(c.Open(9, "/")), c.UNKNOWN_FRAME, "unknown frame"),
    ]:
        conn = ServerConnection()
        _login(conn)
        assert conn.receive_data(data) == []
        assert _frames(conn) == [(c.CLOSE, 1, c.encode_close(1, code, reason)[8:])]
        assert conn.state is State.CLOSING
        # nothing but the answer is read now
        assert conn.receive_data(c.encode(c.Delete(5, "s"))) == []
        ev = conn.receive_data(c.encode(c.CloseResponse(1, c.OK)))
        assert ev == [ConnectionClosed(c.OK, "closed")]


def test_commands_pipelined_behind_open_keep_their_order():
    conn = ServerConnection()
    conn.receive_data(c.encode(c.PeerProperties(1, {}))
                      + c.encode(c.SaslAuthenticate(3, "PLAIN", b"\0u\0p")))
    conn.authenticated(3, "u")
    ev = conn.receive_data(c.encode(c.Tune(0, 0)) + c.encode(c.Open(4, "/"))
                           + c.encode(c.Delete(5, "s")))
    assert ev == [OpenRequested(4, "/"), CommandReceived(c.Delete(5, "s"))]
    assert conn.frame_max == 1048576  # 0: no limit of the client's, the server's holds


def test_octets_counted_for_the_management_api():
    conn = ServerConnection()
    data = c.encode(c.PeerProperties(1, {}))
    conn.receive_data(data)
    out = conn.data_to_send()
    assert (conn.recv_oct, conn.recv_cnt, conn.send_oct, conn.send_cnt) == \
        (len(data), 1, len(out), 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SAMPLES).map(c.encode), st.binary(max_size=40)),
                max_size=12), st.booleans())
def test_fuzz_the_state_machine_never_raises(chunks, accept):
    conn = ServerConnection()
    for data in chunks:
        for ev in conn.receive_data(data):
            # the broker's answers, as the session gives them
            if isinstance(ev, AuthenticateRequested):
                if accept:
                    conn.authenticated(ev.correlation_id, ev.username)
                else:
                    conn.refuse_login(ev.correlation_id)
            elif isinstance(ev, OpenRequested):
                conn.open_ok(ev.correlation_id, ev.virtual_host, {})
            elif isinstance(ev, ClosedByPeer):
                conn.accept_close(ev.correlation_id)
        conn.data_to_send()
        assert conn.reader.buffered <= sum(map(len, chunks))
    if conn.state is State.CLOSED:
        assert conn.receive_data(b"anything") == [] and conn.data_to_send() == b""
