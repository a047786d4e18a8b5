"""x-consistent-hash: weights, stable placement, minimal movement, hash-header/property, errors."""
from __future__ import annotations

import collections

import pytest

from broker.exchanges.consistent_hash import ConsistentHashExchange, jump_hash

from ..support import amqp_error, bind, declare_exchange, declare_queue, make_message
from ._dest import Dest
from ._dest import bind as bind_dest

KEYS = [f"order-{i}" for i in range(20_000)]


def placement(x, keys=KEYS) -> dict:
    return {k: x.route(k, None)[0].name for k in keys}


def test_jump_hash_is_in_range_and_moves_little_when_growing():
    for n in (1, 2, 7, 100):
        assert all(0 <= jump_hash(k, n) < n for k in range(2000))
    before = [jump_hash(k, 10) for k in range(20_000)]
    after = [jump_hash(k, 11) for k in range(20_000)]
    moved = [a for b, a in zip(before, after, strict=True) if a != b]
    assert set(moved) == {10}  # keys only ever move into the new bucket
    assert 0.05 < len(moved) / 20_000 < 0.13  # about 1/11 of them


def test_weights_share_the_keys():
    x = ConsistentHashExchange("h")
    for name, weight in (("a", "1"), ("b", "2"), ("c", "1")):
        bind_dest(x, Dest(name), weight)
    counts = collections.Counter(placement(x).values())
    total = sum(counts.values())
    assert abs(counts["a"] / total - 0.25) < 0.03
    assert abs(counts["b"] / total - 0.50) < 0.03
    assert abs(counts["c"] / total - 0.25) < 0.03


def test_same_key_same_queue_and_a_new_binding_only_takes_keys():
    x = ConsistentHashExchange("h")
    for name in "abcd":
        bind_dest(x, Dest(name), "10")
    first = placement(x)
    assert placement(x) == first
    bind_dest(x, Dest("e"), "10")
    second = placement(x)
    moved = {k for k in KEYS if first[k] != second[k]}
    assert {second[k] for k in moved} == {"e"}
    assert 0.15 < len(moved) / len(KEYS) < 0.25


def test_removing_a_binding_keeps_most_other_keys_in_place():
    x = ConsistentHashExchange("h")
    bindings = {name: bind_dest(x, Dest(name), "10") for name in "abcde"}
    before = placement(x)
    x.remove_binding(bindings["b"].key)
    after = placement(x)
    assert "b" not in set(after.values())
    stayed = sum(1 for k in KEYS if before[k] != "b" and before[k] == after[k])
    # the removed buckets' keys move, and those of the tail buckets moved into the holes
    assert stayed / sum(1 for k in KEYS if before[k] != "b") > 0.7


def test_duplicate_bindings_to_one_queue_add_up_and_remove_cleanly():
    x = ConsistentHashExchange("h")
    q = Dest("q")
    one = bind_dest(x, q, "1")
    bind_dest(x, q, "3")
    bind_dest(x, Dest("r"), "4")
    share = collections.Counter(placement(x).values())
    assert abs(share["q"] / len(KEYS) - 0.5) < 0.03
    x.remove_binding(one.key)
    share = collections.Counter(placement(x).values())
    assert abs(share["q"] / len(KEYS) - 3 / 7) < 0.03


def test_hash_header_and_property():
    by_header = ConsistentHashExchange("h", arguments={"hash-header": "tenant"})
    by_prop = ConsistentHashExchange("p", arguments={"hash-property": b"message_id"})
    for x in (by_header, by_prop):
        for name in "abc":
            bind_dest(x, Dest(name), "5")
    # the routing key does not matter, the header does
    got = {by_header.route(f"rk{i}", {"tenant": b"acme"})[0].name for i in range(50)}
    assert len(got) == 1
    assert by_header.route("rk", {"other": 1}) == []  # no such header: not routed
    assert by_header.route("rk", None) == []
    got = {by_prop.route(f"rk{i}", None, {"message_id": "m-7"})[0].name for i in range(50)}
    assert len(got) == 1
    assert by_prop.route("rk", None, {}) == []


def test_no_bindings_routes_nowhere():
    assert ConsistentHashExchange("h").route("k", None) == []


# ---- through the vhost: declaration and binding errors, as the plugin -----------------------

def test_declare_bind_and_route_through_the_vhost(vhost):
    declare_exchange(vhost, "parts", "x-consistent-hash")
    for i in range(4):
        bind(vhost, "parts", declare_queue(vhost, f"p{i}"), "1")
    seen = {k: [q.name for q in vhost.route("parts", k, make_message(exchange="parts",
                                                                       routing_key=k))]
            for k in KEYS[:2000]}
    assert all(len(v) == 1 for v in seen.values())
    assert len(collections.Counter(v[0] for v in seen.values())) == 4


@pytest.mark.parametrize(("key", "text"), [
    ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
    ("", 'PRECONDITION_FAILED - The binding key must be an integer: <<"">>'),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0: 0"),
    ("-3", "PRECONDITION_FAILED - The binding key must be greater than 0: -3"),
])
def test_bad_weight_is_refused_and_nothing_is_bound(vhost, key, text):
    x = declare_exchange(vhost, "parts", "x-consistent-hash")
    q = declare_queue(vhost, "p")
    with amqp_error(406, text):
        bind(vhost, "parts", q, key)
    assert not x.has_bindings and not q.bindings


@pytest.mark.parametrize(("args", "text"), [
    ({"hash-header": "a", "hash-property": "message_id"}, "mutually exclusive"),
    ({"hash-property": "app_id"}, "hash-property must be one of"),
    ({"hash-header": ""}, "hash-header must be a non-empty string"),
    ({"hash-header": 5}, "hash-header must be a non-empty string"),
])
def test_bad_arguments_are_refused(vhost, args, text):
    with amqp_error(406, text):
        declare_exchange(vhost, "parts", "x-consistent-hash", arguments=args)
    assert "parts" not in vhost.exchanges


def test_routing_key_that_is_not_utf8_is_hashed_not_refused():
    """A routing key with bytes that are not UTF-8 (kept as surrogates) still routes, and
    to the same place each time (the memo and the hash agree)."""
    from broker.exchanges import EXCHANGE_TYPES
    from broker.exchanges.base import Binding

    class Q:
        kind = "queue"

        def __init__(self, name):
            self.name = name

    x = EXCHANGE_TYPES["x-consistent-hash"]("h", durable=False)
    qs = [Q(f"q{i}") for i in range(4)]
    for q in qs:
        x.add_binding(Binding("h", q, "1", {}))
    key = b"order-\xff\xfe".decode("utf-8", "surrogateescape")
    first = x.route(key, None)
    assert len(first) == 1 and x.route(key, None) == first
    x.add_binding(Binding("h", Q("q4"), "1", {}))  # the memo is dropped with the bindings
    assert len(x.route(key, None)) == 1
