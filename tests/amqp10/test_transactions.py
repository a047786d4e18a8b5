"""AMQP 1.0 transactions, protocol side: the coordinator's control messages, and the
transaction ids the sans-IO connection reads from transfers and dispositions (proton's
client engine driven by hand, no sockets)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Data, Described, Message, Terminus, symbol, ulong

from broker.amqp10 import transactions as txn
from broker.amqp10.events import LinkAttached, MessageReceived, OutcomeReceived

from .test_connection import Pair


def _control(body) -> bytes:
    return bytes(Message(body=body).encode())


def test_parse_declare_and_discharge():
    assert txn.parse_control(_control(Described(symbol("amqp:declare:list"), [None]))) \
        == txn.Declare(None)
    assert txn.parse_control(_control(Described(ulong(0x31), []))) == txn.Declare(None)
    assert txn.parse_control(_control(Described(symbol("amqp:discharge:list"),
                                                [b"txn-1", True]))) \
        == txn.Discharge(b"txn-1", True)
    assert txn.parse_control(_control(Described(ulong(0x32), [b"txn-2"]))) \
        == txn.Discharge(b"txn-2", False)


@pytest.mark.parametrize("data", [
    b"", b"\x00\x53\x77\xa1\x03abc", b"\xff" * 10,
    _control("not a control"), _control(Described(ulong(0x32), [])),
    _control(Described(ulong(0x32), [b"x" * 100])), _control(Described(ulong(0x99), [])),
])
def test_bad_control_messages_are_control_errors(data):
    with pytest.raises(txn.ControlError):
        txn.parse_control(data)


def _coordinated() -> tuple[Pair, object, object]:
    p = Pair()
    p.login()
    ssn = p.cc.session()
    ssn.open()
    ctl = ssn.sender("ctl")
    ctl.target.type = Terminus.COORDINATOR
    ctl.open()
    p.pump()
    ev = next(e for e in p.events if isinstance(e, LinkAttached))
    assert ev.coordinator and ev.address is None
    p.srv.attach_coordinator(ev.link, 10)
    p.pump()
    return p, ssn, ctl


def test_declare_answered_with_declared_state():
    p, _ssn, ctl = _coordinated()
    d = ctl.send(Message(body=Described(symbol("amqp:declare:list"), [None])))
    m = next(e for e in p.pump() if isinstance(e, MessageReceived))
    assert m.txn_id is None
    assert txn.parse_control(m.data) == txn.Declare(None)
    p.srv.settle_declared(m.delivery, b"txn-7")
    p.pump()
    assert d.remote_state == txn.DECLARED
    assert bytes(d.remote.data[0]) == b"txn-7"
    caps = ctl.remote_target.capabilities
    caps.rewind()
    assert caps.next() == Data.ARRAY


def test_transactional_transfer_and_disposition_carry_the_txn_id():
    p, ssn, _ctl = _coordinated()
    snd = ssn.sender("pub")
    snd.target.address = "/queue/q"
    snd.open()
    p.pump()
    ev = [e for e in p.events if isinstance(e, LinkAttached)][-1]
    p.srv.attach_receiver(ev.link, "/queue/q", 10)
    p.pump()
    d = snd.send(Message(body="in txn"))
    d.local.data = [b"txn-1"]
    d.update(txn.TRANSACTIONAL_STATE)
    m = next(e for e in p.pump() if isinstance(e, MessageReceived))
    assert m.txn_id == b"txn-1"
    p.srv.settle_transactional(m.delivery, b"txn-1", 0x24)
    p.pump()
    assert d.remote_state == txn.TRANSACTIONAL_STATE
    assert bytes(d.remote.data[0]) == b"txn-1"

    rcv = ssn.receiver("sub")
    rcv.source.address = "/queue/q"
    rcv.open()
    rcv.flow(1)
    p.pump()
    ev = [e for e in p.events if isinstance(e, LinkAttached)][-1]
    p.srv.attach_sender(ev.link, "/queue/q")
    p.pump()
    p.srv.send(ev.link, b"1", bytes(Message(body="x").encode()), False)
    p.pump()
    cd = rcv.current
    rcv.recv(cd.pending)
    rcv.advance()
    cd.local.data = [b"txn-1", Described(ulong(0x27), [True, True])]  # modified
    cd.update(txn.TRANSACTIONAL_STATE)
    o = next(e for e in p.pump() if isinstance(e, OutcomeReceived))
    assert (o.txn_id, o.outcome, o.delivery_failed, o.undeliverable_here) == (
        b"txn-1", 0x27, True, True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_control_messages_only_raise_control_error(data):
    try:
        txn.parse_control(data)
    except txn.ControlError:
        pass


_LONG = st.integers(-(2 ** 63), 2 ** 63 - 1)  # (what the client can encode)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), _LONG, st.text(max_size=20), st.binary(max_size=40),
                 st.lists(_LONG, max_size=3)),
       st.booleans())
def test_discharge_fields_of_any_type(txn_id, fail):
    try:
        parsed = txn.parse_control(_control(Described(ulong(0x32), [txn_id, fail])))
    except txn.ControlError:
        return
    assert isinstance(parsed, txn.Discharge) and parsed.txn_id == txn_id
