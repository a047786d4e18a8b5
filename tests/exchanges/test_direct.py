"""direct, fanout and the default exchange."""
from __future__ import annotations

from broker.exchanges import DirectExchange, FanoutExchange
from broker.exchanges.default import DefaultExchange

from ._dest import Dest, bind, names


def test_direct_exact_key_only():
    x = DirectExchange("d")
    q1, q2 = Dest("q1"), Dest("q2")
    bind(x, q1, "a")
    bind(x, q2, "a")
    bind(x, q2, "b")
    assert names(x.route("a", None)) == ["q1", "q2"]
    assert x.route("b", None) == [q2]
    assert x.route("A", None) == []
    assert x.route("a.b", None) == []
    assert x.route("", None) == []


def test_direct_empty_key_binding():
    x = DirectExchange("d")
    q = Dest("q")
    bind(x, q, "")
    assert x.route("", None) == [q]
    assert x.route("x", None) == []


def test_direct_unbind_cleans_its_index():
    x = DirectExchange("d")
    q1, q2 = Dest("q1"), Dest("q2")
    b1 = bind(x, q1, "a")
    b2 = bind(x, q2, "a")
    x.remove_binding(b1.key)
    assert x.route("a", None) == [q2]
    x.remove_binding(b2.key)
    assert x.route("a", None) == []
    assert x._by_key == {}
    assert not x.has_bindings


def test_direct_binding_arguments_make_distinct_bindings():
    x = DirectExchange("d")
    q = Dest("q")
    bind(x, q, "a", {"v": 1})
    bind(x, q, "a", {"v": 2})
    assert len(x.bindings) == 2
    assert x.route("a", None) == [q, q]  # the vhost deduplicates destinations


def test_fanout_ignores_the_key():
    x = FanoutExchange("f")
    q1, q2 = Dest("q1"), Dest("q2")
    b1 = bind(x, q1, "x")
    bind(x, q2, "")
    assert names(x.route("anything", None)) == ["q1", "q2"]
    x.remove_binding(b1.key)
    assert x.route("", None) == [q2]


def test_fanout_without_bindings_routes_nowhere():
    assert FanoutExchange("f").route("k", None) == []


def test_default_exchange_routes_by_queue_name():
    queues = {}
    x = DefaultExchange(queues)
    assert x.name == "" and x.durable
    assert x.route("q", None) == []
    q = Dest("q")
    queues["q"] = q
    assert x.route("q", None) == [q]
    queues["hidden"] = Dest("hidden", internal=True)  # broker-internal: never routed to by name
    assert x.route("hidden", None) == []
    assert x.route("Q", None) == []
    del queues["q"]
    assert x.route("q", None) == []
