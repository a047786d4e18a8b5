"""topic exchange: RabbitMQ's matching rules and the binding trie behind them."""
from __future__ import annotations

import pytest

from broker.exchanges import TopicExchange

from ._dest import Dest, bind, names

# (binding pattern, routing key, matches) as RabbitMQ 3.10 decides them
CASES = [
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b.c", "a.b.c.d", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "", False),  # the empty key has no words
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),  # '#' matches zero words
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("#.#", "a.b", True),
    ("#.#", "", True),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.*", "a.b.c", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("", "", True),
    ("", "a", False),
    ("a..b", "a..b", True),  # empty words are words
    ("a.*.b", "a..b", True),
    ("a.b", "a.B", False),  # case-sensitive
    ("a.#", "ab", False),
]


@pytest.mark.parametrize(("pattern", "key", "matches"), CASES)
def test_pattern(pattern, key, matches):
    x = TopicExchange("t")
    q = Dest("q")
    bind(x, q, pattern)
    assert (x.route(key, None) == [q]) is matches


def test_each_binding_once_even_when_reached_along_several_paths():
    # '#.#' reaches the same trie node by several splits of the key; a binding is
    # reported once. (Several bindings to one queue are deduplicated by the vhost.)
    x = TopicExchange("t")
    q1, q2 = Dest("q1"), Dest("q2")
    for pattern in ("#", "a.#", "a.*", "*.b", "a.b", "#.b", "#.#", "#.#.#"):
        bind(x, q1, pattern)
    bind(x, q2, "a.b")
    assert names(x.route("a.b", None)) == ["q1"] * 8 + ["q2"]
    assert names(x.route("a.z", None)) == ["q1"] * 5


def test_hash_chains_do_not_duplicate_or_explode():
    x = TopicExchange("t")
    q = Dest("q")
    bind(x, q, "#.#.#.#.#")
    assert x.route(".".join("w" * 30), None) == [q]


def test_many_bindings_route_only_the_matching_ones():
    x = TopicExchange("t")
    dests = {}
    for i in range(2000):
        d = Dest(f"q{i}")
        dests[i] = d
        bind(x, d, f"orders.{i}.created")
    star = Dest("star")
    bind(x, star, "orders.*.created")
    assert names(x.route("orders.1234.created", None)) == ["q1234", "star"]
    assert names(x.route("orders.99999.created", None)) == ["star"]
    assert x.route("orders.1234.deleted", None) == []


def _trie_size(node) -> int:
    return 1 + sum(_trie_size(child) for child in node.children.values())


def test_unbind_prunes_the_trie():
    x = TopicExchange("t")
    q = Dest("q")
    bindings = [bind(x, q, key) for key in ("a.b.c", "a.b.#", "a.*.c.d", "#", "x")]
    assert _trie_size(x._root) > 1
    for b in bindings:
        assert x.remove_binding(b.key) is b
    assert x.route("a.b.c", None) == []
    assert x._root.children == {}
    assert x._root.bindings == {}
    assert x.bindings == {}


def test_unbind_keeps_shared_prefixes_of_other_bindings():
    x = TopicExchange("t")
    q1, q2 = Dest("q1"), Dest("q2")
    b1 = bind(x, q1, "a.b.c")
    bind(x, q2, "a.b")
    x.remove_binding(b1.key)
    assert x.route("a.b.c", None) == []
    assert x.route("a.b", None) == [q2]
    assert list(x._root.children["a"].children["b"].children) == []


def test_same_pattern_two_destinations_unbind_one():
    x = TopicExchange("t")
    q1, q2 = Dest("q1"), Dest("q2")
    b1 = bind(x, q1, "a.*")
    bind(x, q2, "a.*")
    x.remove_binding(b1.key)
    assert x.route("a.z", None) == [q2]


def test_queue_and_exchange_of_the_same_name_are_different_destinations():
    x = TopicExchange("t")
    q, e = Dest("same"), Dest("same", kind="exchange")
    bind(x, q, "k")
    bind(x, e, "k")
    assert len(x.route("k", None)) == 2


def test_removing_an_unknown_binding_is_harmless():
    x = TopicExchange("t")
    q = Dest("q")
    b = bind(x, q, "a.b")
    assert x.remove_binding(("queue", "q", "zz.yy", ())) is None
    assert x.remove_binding(b.key) is b
    assert x.remove_binding(b.key) is None


def test_duplicate_binding_is_added_once():
    x = TopicExchange("t")
    q = Dest("q")
    bind(x, q, "a.#")
    from broker.exchanges import Binding
    assert x.add_binding(Binding("t", q, "a.#", {})) is False
    assert len(x.bindings) == 1


def test_mqtt_subscriptions_with_a_leading_wildcard_never_match_dollar_keys():
    """MQTT-4.7.2-1 on MQTT subscriptions (marked by their binding argument); an AMQP binding
    keeps AMQP's meaning, and removing a binding removes its rule."""
    from broker.exchanges.topic import MQTT_SUBSCRIPTION_ARG

    x = TopicExchange("amq.topic")
    plus, hash_, sys_, amqp = Dest("plus"), Dest("hash"), Dest("sys"), Dest("amqp")
    bind(x, plus, "*.*", {MQTT_SUBSCRIPTION_ARG: "+/+"})
    b = bind(x, hash_, "#", {MQTT_SUBSCRIPTION_ARG: "#"})
    bind(x, sys_, "$SYS.#", {MQTT_SUBSCRIPTION_ARG: "$SYS/#"})
    bind(x, amqp, "#")
    assert names(x.route("$SYS.b", None)) == ["amqp", "sys"]
    assert names(x.route("a.b", None)) == ["amqp", "hash", "plus"]
    assert names(x.route("a.$b", None)) == ["amqp", "hash", "plus"]
    # the same queue through a second, literal subscription still gets the '$' topic
    bind(x, plus, "$SYS.b", {MQTT_SUBSCRIPTION_ARG: "$SYS/b"})
    assert names(x.route("$SYS.b", None)) == ["amqp", "plus", "sys"]
    x.remove_binding(b.key)
    assert not any(key[1] == "hash" for key in x._no_dollar)


@pytest.mark.parametrize("topic", ["a/b/c", "a.b/c", "P/*", "x/%2E/y", "100%/./*.*", "$SYS/x",
                                   "", "/", "a//b"])
def test_mqtt_topics_mean_exactly_themselves(topic):
    from broker.mqtt.topics import to_mqtt_topic, to_routing_key

    key = to_routing_key(topic)
    assert to_mqtt_topic(key) == topic
    assert key.count(".") == topic.count("/")  # one AMQP word per MQTT level
    assert "*" not in key  # no literal character becomes an AMQP wildcard


def test_mqtt_filters_map_their_wildcards_only():
    from broker.mqtt.topics import to_routing_key

    assert to_routing_key("a/+/#") == "a.*.#"
    assert to_routing_key("P/*") == "P.%2A"
    assert to_routing_key("a.b/+") == "a%2Eb.*"


def test_routes_are_remembered_until_a_binding_changes():
    import broker.exchanges.topic as topic

    x = TopicExchange("t")
    a, b = Dest("a"), Dest("b")
    ba = bind(x, a, "k.*")
    assert names(x.route("k.1", None)) == ["a"]
    routed = x.route("k.1", None)
    routed.append(b)  # a caller's list is its own
    assert names(x.route("k.1", None)) == ["a"]
    bind(x, b, "#")
    assert names(x.route("k.1", None)) == ["a", "b"]
    x.remove_binding(ba.key)
    assert names(x.route("k.1", None)) == ["b"]
    for i in range(topic.CACHE_KEYS + 10):
        x.route(f"k.{i}", None)
    assert len(x._cache) <= topic.CACHE_KEYS
