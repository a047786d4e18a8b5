"""Binding arguments nested as deep as a frame holds (18,000 levels, what the codec now
accepts): a bind, the same bind again (idempotent), an unbind and a headers-exchange
binding neither recurse nor raise RecursionError (the binding key was a nested tuple,
built and compared recursively), and keys still tell arguments apart."""
from __future__ import annotations

from broker.exchanges.base import _freeze

from ..support import bind, declare_exchange, declare_queue, unbind


def deep(levels: int, leaf=1) -> dict:
    d: dict = {"leaf": leaf}
    for i in range(levels):
        d = {"k": d} if i % 2 else {"k": [d]}
    return d


def test_freeze_is_flat_and_distinguishes_arguments():
    assert _freeze({}) == ()
    a, b = _freeze(deep(18_000)), _freeze(deep(18_000))
    assert a == b and hash(a) == hash(b)
    assert _freeze(deep(18_000, leaf=2)) != a
    assert _freeze(deep(17_999)) != a
    assert _freeze({"x": 1, "y": [b"a", bytearray(b"b")]}) == _freeze(
        {"y": [b"a", b"b"], "x": 1})                     # key order does not matter
    assert _freeze({"x": [1, 2]}) != _freeze({"x": [2, 1]})  # array order does
    assert _freeze({"x": {"y": 1}}) != _freeze({"x": [{"y": 1}]})
    assert _freeze({"x": "y"}) != _freeze({"x": {"y": None}})


def test_bind_twice_and_unbind_with_deep_arguments(vhost):
    q = declare_queue(vhost, "q")
    declare_exchange(vhost, "h", "headers")
    for source in ("amq.direct", "h"):
        bind(vhost, source, q, "k", deep(18_000))
        bind(vhost, source, q, "k", deep(18_000))    # the same binding: no second one
        assert len(vhost.exchanges[source].bindings) == 1
        bind(vhost, source, q, "k", deep(18_000, leaf=2))
        assert len(vhost.exchanges[source].bindings) == 2
        unbind(vhost, source, q, "k", deep(18_000))
        unbind(vhost, source, q, "k", deep(18_000, leaf=2))
        assert len(vhost.exchanges[source].bindings) == 0
