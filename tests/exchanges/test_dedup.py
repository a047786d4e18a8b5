"""x-message-deduplication: the plugin's exchange contract (cache size, TTLs, arguments)."""
from __future__ import annotations

import pytest

from broker.exchanges.dedup import MessageDeduplicationExchange

from ..support import amqp_error, declare_exchange
from ._dest import Dest
from ._dest import bind as bind_dest


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(MessageDeduplicationExchange, "clock", c)
    return c


def make(clock, **args):
    x = MessageDeduplicationExchange("d", arguments={"x-cache-size": 3, **args})
    bind_dest(x, Dest("q1"))
    bind_dest(x, Dest("q2"), "any key: routes as a fanout")
    return x


def routed(x, value=None, **headers):
    if value is not None:
        headers["x-deduplication-header"] = value
    return sorted(d.name for d in x.route("rk", headers or None))


def test_duplicates_are_dropped_others_fan_out(clock):
    x = make(clock)
    assert routed(x, "a") == ["q1", "q2"]
    assert routed(x, "a") == []
    assert routed(x, b"a") == []  # bytes and text of the same value are the same key
    assert routed(x, "b") == ["q1", "q2"]
    assert routed(x) == ["q1", "q2"] and routed(x) == ["q1", "q2"]  # no header: no check
    assert x.dropped == 2


def test_cache_size_forgets_the_oldest(clock):
    x = make(clock)
    for v in "abcd":  # size 3: "a" is forgotten when "d" comes
        assert routed(x, v)
    assert routed(x, "a") == ["q1", "q2"]
    assert routed(x, "d") == []


def test_exchange_ttl_and_message_ttl(clock):
    x = make(clock, **{"x-cache-ttl": 1000})
    assert routed(x, "a")
    clock.t += 0.9
    assert routed(x, "a") == []
    clock.t += 0.2
    assert routed(x, "a")  # expired: a new message
    assert routed(x, "b", **{"x-cache-ttl": 5000})
    clock.t += 2
    assert routed(x, "b") == []  # its own TTL overrides the exchange's


@pytest.mark.parametrize(("args", "text"), [
    ({}, "x-cache-size must be a positive integer"),
    ({"x-cache-size": 0}, "x-cache-size must be a positive integer"),
    ({"x-cache-size": "ten"}, "x-cache-size must be a positive integer"),
    ({"x-cache-size": 5, "x-cache-ttl": -1}, "x-cache-ttl must be a positive integer"),
    ({"x-cache-size": 5, "x-cache-persistence": "disk"}, "'disk' is not supported"),
    ({"x-cache-size": 5, "x-cache-persistence": "tape"}, "must be 'memory'"),
])
def test_bad_arguments_406(vhost, args, text):
    with amqp_error(406, text):
        declare_exchange(vhost, "d", "x-message-deduplication", arguments=args)
    assert "d" not in vhost.exchanges


def test_numeric_string_size_is_accepted_as_by_the_plugin(vhost):
    x = declare_exchange(vhost, "d", "x-message-deduplication", arguments={"x-cache-size": "5"})
    assert x.cache_size == 5
