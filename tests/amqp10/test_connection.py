"""The sans-IO AMQP 1.0 connection fed bytes: by proton's own client engine (a client
``Transport`` pumped by hand, no sockets) and by hand-made hostile frames."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Collector, Connection, Message, Transport

from broker.amqp10 import sasl
from broker.amqp10.connection import ServerConnection
from broker.amqp10.events import (
    ConnectionOpened,
    LinkAttached,
    MessageReceived,
    NoSasl,
    OutcomeReceived,
    ProtocolError,
    SaslInit,
)


class Pair:
    """A proton client engine wired to the server connection through byte strings."""

    def __init__(self, max_message_size: int = 1 << 20, user: str = "guest",
                 password: str = "guest", use_sasl: bool = True):
        self.srv = ServerConnection(max_message_size, ["PLAIN"])
        self.ct = Transport()
        self.cc = Connection()
        self.cc.collect(Collector())
        if use_sasl:
            self.cc.user = user
            self.cc.password = password
            s = self.ct.sasl()
            s.allowed_mechs("PLAIN")
            s.allow_insecure_mechs = True
        self.ct.bind(self.cc)
        self.cc.hostname = "vhost:/"
        self.cc.open()
        self.events: list = []

    def pump(self) -> list:
        events = []
        for _ in range(50):
            moved = False
            n = self.ct.pending()
            if n > 0:
                data = self.ct.peek(n)
                self.ct.pop(n)
                events += self.srv.receive_data(data)
                moved = True
            out = self.srv.data_to_send()
            if out:
                self.ct.push(out)
                moved = True
            if not moved:
                break
        self.events += events
        return events

    def login(self) -> None:
        evs = self.pump()
        assert isinstance(evs[0], SaslInit)
        assert evs[0].response == b"\x00guest\x00guest"
        self.srv.sasl_outcome(True)
        evs = self.pump()
        assert any(isinstance(e, ConnectionOpened) for e in evs)
        self.srv.accept_open()
        self.pump()


def _attached(pair: Pair, kind: type) -> LinkAttached:
    return next(e for e in pair.events if isinstance(e, kind))


def test_sasl_plain_then_open():
    p = Pair()
    p.login()
    opened = next(e for e in p.events if isinstance(e, ConnectionOpened))
    assert opened.hostname == "vhost:/"
    assert p.cc.remote_container == "triomq"


def test_refused_login_sends_auth_outcome_and_ends():
    p = Pair(password="wrong")
    evs = p.pump()
    assert isinstance(evs[0], SaslInit)
    p.srv.sasl_outcome(False)
    out = p.srv.data_to_send()
    # sasl-outcome with code 1 (auth)
    assert out[8:11] == b"\x00\x53\x44"
    assert p.srv.finished and p.srv.done


def test_amqp_header_without_sasl_is_the_brokers_decision():
    p = Pair(use_sasl=False)
    evs = p.pump()
    assert isinstance(evs[0], NoSasl)
    p.srv.sasl_outcome(False)
    assert p.srv.data_to_send() == sasl.SASL_HEADER
    assert p.srv.finished


def test_bad_header_gets_the_supported_one():
    srv = ServerConnection(1000, ["PLAIN"])
    srv.receive_data(b"HTTP/1.1")
    assert srv.data_to_send() == sasl.SASL_HEADER
    assert srv.finished and srv.done


def test_sasl_frame_over_the_bound_is_refused_before_it_arrives():
    srv = ServerConnection(1000, ["PLAIN"])
    srv.receive_data(sasl.SASL_HEADER)
    srv.data_to_send()
    # declares 1 GiB: refused at once, nothing is held for it
    srv.receive_data(struct.pack(">IBBH", 1 << 30, 2, 1, 0))
    assert srv.finished and "bad SASL frame" in (srv.error or "")


def test_transfer_assembled_across_frames_and_settled():
    p = Pair()
    p.login()
    ssn = p.cc.session()
    ssn.open()
    snd = ssn.sender("s")
    snd.target.address = "/queues/q"
    snd.open()
    p.pump()
    att = _attached(p, LinkAttached)
    assert att.address == "/queues/q" and att.link.is_receiver
    p.srv.attach_receiver(att.link, att.address, 10)
    p.pump()
    body = b"x" * 500_000  # several 128 KiB frames
    d = snd.delivery(b"1")
    snd.send(Message(body=body, inferred=True).encode())
    snd.advance()
    evs = p.pump()
    got = [e for e in evs if isinstance(e, MessageReceived)]
    assert len(got) == 1
    m = Message()
    m.decode(got[0].data)
    assert bytes(m.body) == body
    p.srv.settle_incoming(got[0].delivery, 36)  # accepted
    p.pump()
    assert d.remote_state == 36


def test_message_over_the_limit_detaches_the_link():
    p = Pair(max_message_size=100_000)
    p.login()
    ssn = p.cc.session()
    ssn.open()
    snd = ssn.sender("s")
    snd.target.address = "/queues/q"
    snd.open()
    p.pump()
    att = _attached(p, LinkAttached)
    p.srv.attach_receiver(att.link, att.address, 10)
    p.pump()
    snd.delivery(b"1")
    snd.send(b"\x00Su\xb0" + struct.pack(">I", 300_000) + b"y" * 300_000)
    snd.advance()
    evs = p.pump()
    assert not [e for e in evs if isinstance(e, MessageReceived)]
    assert snd.remote_condition.name == "amqp:link:message-size-exceeded"


def test_delivery_out_and_outcome_back():
    p = Pair()
    p.login()
    ssn = p.cc.session()
    ssn.open()
    rcv = ssn.receiver("r")
    rcv.source.address = "/queues/q"
    rcv.open()
    rcv.flow(5)
    p.pump()
    att = _attached(p, LinkAttached)
    assert not att.link.is_receiver
    p.srv.attach_sender(att.link, att.address)
    p.pump()
    assert att.link.credit == 5
    p.srv.send(att.link, b"1", Message(body="hi").encode(), False)
    p.pump()
    d = rcv.current
    assert Message(body=None).decode(rcv.recv(d.pending)) is None
    rcv.advance()
    d.update(d.REJECTED)
    d.settle()
    evs = p.pump()
    outcome = next(e for e in evs if isinstance(e, OutcomeReceived))
    assert outcome.outcome == d.REJECTED


def test_undecodable_frame_after_login_closes_with_an_error():
    p = Pair()
    p.login()
    # a frame whose body is not a described performative
    evs = p.srv.receive_data(struct.pack(">IBBH", 12, 2, 0, 0) + b"\xff\xff\xff\xff")
    assert any(isinstance(e, ProtocolError) for e in evs)
    assert p.srv.finished
    assert b"amqp:" in p.srv.data_to_send()  # the close frame with its error condition


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_before_login_never_raises(data):
    srv = ServerConnection(1000, ["PLAIN"])
    srv.receive_data(data)
    srv.data_to_send()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_after_login_never_raises(data):
    p = Pair()
    p.login()
    p.srv.receive_data(data)
    p.srv.data_to_send()


def test_undecodable_frame_before_open_gets_open_and_close():
    """Garbage right after the AMQP header: proton writes its open but no close before the
    peer's open; the connection writes the close (with amqp:decode-error) itself."""
    from proton import Data, Described, symbol, ulong
    srv = ServerConnection(1 << 20, ["PLAIN"])
    srv.receive_data(sasl.SASL_HEADER)
    d = Data()
    d.put_object(Described(ulong(0x41), [symbol("PLAIN"), b"\x00guest\x00guest"]))
    body = bytes(d.encode())
    srv.receive_data(struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body)
    srv.sasl_outcome(True)
    srv.data_to_send()
    evs = srv.receive_data(sasl.AMQP_HEADER + struct.pack(">IBBH", 12, 2, 0, 0) + b"\xff" * 4)
    assert any(isinstance(e, ProtocolError) for e in evs)
    out = srv.data_to_send()
    assert out.startswith(sasl.AMQP_HEADER)
    frames, pos = [], 8
    while pos < len(out):
        size = struct.unpack_from(">I", out, pos)[0]
        f = Data()
        f.decode(out[pos + 8:pos + size])
        f.rewind()
        f.next()
        frames.append(f.get_object())
        pos += size
    assert [fr.descriptor for fr in frames] == [0x10, 0x18]  # open, close
    assert frames[1].value[0].value[0] == "amqp:decode-error"
    assert not srv.has_output
