"""The C hooks (``broker/audit/_hooks.c``) against their Python reference (``hooks.PyHooks``):
the same calls must leave the same records in the buffer and return the same positions.

The objects handed to the hooks are plain attribute holders shaped like the broker's
channel, message, queue, entry and unacked item: the hooks only read those attributes."""
from __future__ import annotations

import os
from types import SimpleNamespace as NS

import pytest

from broker.audit import events, hooks


def _c_class():
    try:
        from broker.audit._hooks import Hooks
    except ImportError:
        return None
    return Hooks


C_HOOKS = _c_class()


def test_the_c_hooks_are_built_and_chosen():
    # ``pip install -e .`` (make setup) builds them; without them the trail is slower
    assert C_HOOKS is not None, "broker/audit/_hooks.c was not built"
    if not os.environ.get("TRIOMQ_AUDIT_PYTHON"):
        assert hooks.Hooks is C_HOOKS


def _trail(base: type, *, limit=10_000, scope_all=True, drop_at=None):
    class Trail(base):  # type: ignore[misc, valid-type]
        def __init__(self):
            self.buf = []
            self.base = 0
            self.limit = limit * events.WIDTH
            self.now = 0.0
            self._scope_all = scope_all
            self._vhosts_on = {"v": 1, "off": 0}
            self.dropped_total = 0
            self.fulls = 0
            self.sealed: list = []

        def _full(self):
            self.fulls += 1
            if drop_at is not None:
                del self.buf[-events.WIDTH:]
                self.dropped_total += 1
                return
            self.sealed += self.buf[:events.WIDTH]  # the oldest event leaves the buffer
            del self.buf[:events.WIDTH]
            self.base += events.WIDTH

        @staticmethod
        def _channel_ctx(channel):
            ctx = channel.audit_ctx = (channel.vhost, "guest", "peer:1", channel.number)
            return ctx
    return Trail()


def _objects():
    q1 = NS(name="q1", audit_ctx=("v", "q1"), refused_id=None)
    q2 = NS(name="q2", audit_ctx=("v", "q2"), refused_id=7)  # refused message 7
    q3 = NS(name="q3", audit_ctx=None, refused_id=None)  # not followed
    q4 = NS(name="q4")  # a queue-like object without the attribute at all
    ch = NS(vhost="v", number=1)  # no audit_ctx yet: the trail makes it
    ch_off = NS(vhost="off", number=2, audit_ctx=("off", "guest", "p", 2))

    def msg(i, props=None):
        return NS(id=i, exchange="x", routing_key=f"k{i}", properties=props or {},
                  body=b"b" * i, persistent=bool(i % 2))
    return q1, q2, q3, q4, ch, ch_off, msg


def _script(t, clock):
    """A run of hook calls; returns what they returned."""
    q1, q2, q3, q4, ch, ch_off, msg = _objects()
    out = []
    clock(t, 1000.5)
    out.append(t.published(ch, msg(1, {"message_id": "m1"}), [q1], "routed", 1))
    out.append(t.published(ch, msg(7), [q1, q2, q3], "routed", 2))  # q2 refused 7
    out.append(t.published(ch, msg(8, {"delivery_mode": 2}), [q1, q2], "routed", 0))
    out.append(t.published(ch, msg(13, {"headers": {"x-seq": 1}}), [q1], "routed", 7))
    out.append(t.published(ch, msg(9), [q3], "routed", 3))  # into: None
    out.append(t.published(ch, msg(10), [], "unroutable", 4))
    out.append(t.published(ch, msg(11), (q1,), "taken", 5))
    out.append(t.published(ch_off, msg(12), [q1], "routed", 6))  # vhost not audited
    e1 = NS(message=msg(1), redelivered=False, delivery_count=0)
    e2 = NS(message=msg(8), redelivered=True, delivery_count=2)
    p1 = t.delivered(ch, "ctag", 1, q1, e1)
    p2 = t.delivered(ch, None, 2, q2, e2)
    out += [p1, p2, t.delivered(ch, "c", 3, q3, e1), t.delivered(ch, "c", 4, q4, e1)]
    clock(t, 0.0)  # outside a batch: the clock is read (not compared)
    consumer = NS(tag="ctag")
    out.append(t.acked(ch, NS(audit_pos=p1, queue=q1, entry=e1, consumer=consumer, tag=1)))
    out.append(t.acked(ch, NS(audit_pos=-1, queue=q2, entry=e2, consumer=None, tag=2)))
    out.append(t.acked(ch, NS(audit_pos=-1, queue=q3, entry=e2, consumer=None, tag=2)))
    clock(t, 2000.25)
    out.append(t.acked(ch, NS(audit_pos=p2, queue=q2, entry=e2, consumer=consumer, tag=2)))
    out.append(t.acked(ch, NS(audit_pos=p2, queue=q2, entry=e2, consumer=consumer, tag=2)))
    return out


def _clock(t, value):
    if value:
        t.clock_start()
        t.now = value  # a fixed batch time, so both runs record the same
    else:
        t.clock_stop()


def _same(a, b):
    """Equal records, times outside a batch only checked to be floats near now."""
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, float) and x not in (1000.5, 2000.25):
            assert isinstance(y, float) and abs(x - y) < 60, i
        else:
            assert x == y, (i, x, y)


@pytest.mark.skipif(C_HOOKS is None, reason="the C hooks are not built")
@pytest.mark.parametrize("limit", [10_000, 1])
def test_c_and_python_hooks_record_the_same(limit):
    py, c = _trail(hooks.PyHooks, limit=limit), _trail(C_HOOKS, limit=limit)
    assert _script(py, _clock) == _script(c, _clock)
    _same(py.sealed + py.buf, c.sealed + c.buf)
    assert (py.base, py.fulls) == (c.base, c.fulls)
    kinds = (py.sealed + py.buf)[::events.WIDTH]
    assert kinds.count(events.PUBC) == 8
    props = (py.sealed + py.buf)[6::events.WIDTH]
    # a property dict only where it holds something the trail keeps
    assert {"message_id": "m1"} in props and {"headers": {"x-seq": 1}} in props
    assert {"delivery_mode": 2} not in props and {} not in props
    if limit > 1:  # both deliveries still buffered at their acks: folded (a second ack not)
        assert kinds.count(events.DACK) == 2 and kinds.count(events.ACKC) == 2
    else:  # each delivery sealed before its ack: separate ack records
        assert kinds.count(events.DACK) == 0 and kinds.count(events.ACKC) == 4


@pytest.mark.skipif(C_HOOKS is None, reason="the C hooks are not built")
def test_c_and_python_hooks_agree_on_scope_and_drops():
    for base in (hooks.PyHooks, C_HOOKS):
        t = _trail(base, scope_all=False, limit=2, drop_at=True)
        q1, q2, q3, q4, ch, ch_off, msg = _objects()
        t.published(ch_off, msg(1), [q1], "routed", 1)
        assert t.buf == []  # vhost "off" has no audited queue
        t.published(ch, msg(2), [q1], "routed", 2)
        e = NS(message=msg(2), redelivered=False, delivery_count=0)
        assert t.delivered(ch, "c", 1, q1, e) == events.WIDTH
        assert t.delivered(ch, "c", 2, q1, e) == -1  # dropped by the policy: no position
        assert t.dropped_total == 1 and len(t.buf) == 2 * events.WIDTH


@pytest.mark.skipif(C_HOOKS is None, reason="the C hooks are not built")
def test_c_hooks_report_bad_input_as_python_errors():
    t = _trail(C_HOOKS)
    _q1, *_ = _objects()
    with pytest.raises(TypeError):
        t.published(1, 2)
    with pytest.raises(AttributeError):
        t.published(NS(audit_ctx=("v",)), NS(id=1), [], "routed", 1)  # no exchange
    t.buf = None
    with pytest.raises(TypeError, match="not a list"):
        t.delivered(NS(audit_ctx=("v",)), "c", 1, _q1, NS(message=NS(id=1)))
