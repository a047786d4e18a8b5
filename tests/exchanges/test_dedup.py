"""x-message-deduplication: the plugin's exchange contract (cache size, TTLs, arguments), and
the cache on disk (``x-cache-persistence: disk``) across restarts of every store."""
from __future__ import annotations

import pytest

from broker.exchanges.dedup import CacheQueue, MessageDeduplicationExchange, cache_queue_name

from ..support import amqp_error, bind, declare_exchange, declare_queue, make_message
from ..support import broker_life as _life
from ._dest import Dest
from ._dest import bind as bind_dest


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def xclock(monkeypatch):
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


def test_duplicates_are_dropped_others_fan_out(xclock):
    x = make(xclock)
    assert routed(x, "a") == ["q1", "q2"]
    assert routed(x, "a") == []
    assert routed(x, b"a") == []  # bytes and text of the same value are the same key
    assert routed(x, "b") == ["q1", "q2"]
    assert routed(x) == ["q1", "q2"] and routed(x) == ["q1", "q2"]  # no header: no check
    assert x.dropped == 2


def test_values_keep_their_type_and_long_values_are_bounded(xclock):
    x = make(xclock, **{"x-cache-size": 10})
    assert routed(x, 1) and routed(x, "1")  # an integer and a text are different values
    assert routed(x, 1) == [] and routed(x, "1") == []
    long_a, long_b = "a" * 100_000, "a" * 99_999 + "b"
    assert routed(x, long_a) and routed(x, long_b)  # kept by digest, still told apart
    assert routed(x, long_a) == [] and routed(x, long_b) == []
    assert all(len(k) <= 128 for k in x._mem)


def test_cache_size_forgets_the_oldest(xclock):
    x = make(xclock)
    for v in "abcd":  # size 3: "a" is forgotten when "d" comes
        assert routed(x, v)
    assert routed(x, "a") == ["q1", "q2"]
    assert routed(x, "d") == []


def test_exchange_ttl_and_message_ttl(xclock):
    x = make(xclock, **{"x-cache-ttl": 1000})
    assert routed(x, "a")
    xclock.t += 0.9
    assert routed(x, "a") == []
    xclock.t += 0.2
    assert routed(x, "a")  # expired: a new message
    assert routed(x, "b", **{"x-cache-ttl": 5000})
    xclock.t += 2
    assert routed(x, "b") == []  # its own TTL overrides the exchange's


@pytest.mark.parametrize(("args", "text"), [
    ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 0}, "'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": "ten"}, "'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": True}, "'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 5, "x-cache-ttl": -1},
     "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"),
    ({"x-cache-size": 5, "x-cache-persistence": "tape"},
     "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"),
    ({"x-cache-size": 5, "x-cache-persistence": 1}, "'x-cache-persistence' must be either"),
])
def test_bad_arguments_406(vhost, args, text):
    with amqp_error(406, text):
        declare_exchange(vhost, "d", "x-message-deduplication", arguments=args)
    assert "d" not in vhost.exchanges
    assert cache_queue_name("d") not in vhost.queues  # nothing half-made


def test_numeric_string_size_is_accepted_as_by_the_plugin(vhost):
    x = declare_exchange(vhost, "d", "x-message-deduplication", arguments={"x-cache-size": "5"})
    assert x.cache_size == 5


# ---------------------------------------------------------------- x-cache-persistence: disk
DISK = {"x-cache-size": 3, "x-cache-persistence": "disk"}


def publish(vhost, value, exchange="d", **props):
    headers = {"x-deduplication-header": value} if value is not None else {}
    m = make_message(b"m", exchange=exchange, headers=headers, delivery_mode=2, **props)
    queues = vhost.route(exchange, "", m)
    for q in queues:
        q.enqueue(m)
    return [q.name for q in queues if not q.internal]


def test_disk_cache_lives_in_an_internal_queue_evicted_by_its_max_length(vhost):
    x = declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
    q = declare_queue(vhost, "q")
    bind(vhost, "d", q)
    for v in "abcd":
        assert publish(vhost, v) == ["q"]
    cq = x.cache_queue
    assert isinstance(cq, CacheQueue) and cq.internal and vhost.find_queue(cq.name) is None
    assert [e.message.body for e in cq.stored_entries()] == [b"sb", b"sc", b"sd"]
    assert x.cached == 3
    assert publish(vhost, "a") == ["q"]  # evicted with its marker
    assert publish(vhost, "d") == []
    assert q.message_count == 5


def test_disk_cache_markers_expire_with_the_ttl(vhost, clock, xclock):
    x = declare_exchange(vhost, "d", "x-message-deduplication", durable=True,
                         arguments={**DISK, "x-cache-ttl": 1000})
    bind(vhost, "d", declare_queue(vhost, "q"))
    assert publish(vhost, "a") == ["q"]
    clock.advance(1.1)  # the marker expires in its queue ...
    assert x.cache_queue.message_count == 0 and x.cached == 0  # ... and the value is forgotten
    xclock.t += 1.1
    assert publish(vhost, "a") == ["q"]


def test_values_seen_before_the_exchange_had_a_queue_are_written_once_it_has_one(vhost):
    x = declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
    assert publish(vhost, "a") == [] and x.cache_queue is None
    bind(vhost, "d", declare_queue(vhost, "q"))
    assert publish(vhost, "b") == ["q"]
    assert [e.message.body for e in x.cache_queue.stored_entries()] == [b"sa", b"sb"]
    assert publish(vhost, "a") == []


def test_a_redeclared_exchange_does_not_inherit_the_deleted_ones_cache(vhost):
    declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
    bind(vhost, "d", declare_queue(vhost, "q"))
    publish(vhost, "a")
    vhost.delete_exchange("d")
    x = declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
    bind(vhost, "d", vhost.queues["q"])
    assert publish(vhost, "a") == ["q"]
    assert [e.message.body for e in x.cache_queue.stored_entries()] == [b"sa"]


@pytest.fixture(params=["journal", "sqlite"])
def store_url(request, tmp_path):
    return "journal" if request.param == "journal" else f"sqlite:///{tmp_path}/store.db"


def test_disk_cache_survives_a_restart_on_every_store(store_url, tmp_path):
    seen = {}

    def first(vhost):
        declare_exchange(vhost, "d", "x-message-deduplication", durable=True,
                         arguments={**DISK, "x-cache-size": 100})
        bind(vhost, "d", declare_queue(vhost, "q", durable=True))
        for i in range(50):
            assert publish(vhost, f"v{i}") == ["q"]
        declare_exchange(vhost, "mem", "x-message-deduplication", durable=True,
                         arguments={"x-cache-size": 10})
        bind(vhost, "mem", vhost.queues["q"])
        assert publish(vhost, "m", exchange="mem") == ["q"]

    def second(vhost):
        x = vhost.exchanges["d"]
        seen["cached"] = x.cached
        seen["again"] = [publish(vhost, f"v{i}") for i in range(50)]
        seen["new"] = publish(vhost, "v50")
        seen["memory"] = publish(vhost, "m", exchange="mem")  # memory: forgotten, as the plugin
        seen["q"] = vhost.queues["q"].message_count
        seen["hidden"] = vhost.find_queue(cache_queue_name("d"))

    _life(store_url, tmp_path / "data", first)
    _life(store_url, tmp_path / "data", second)
    assert seen["cached"] == 50
    assert seen["again"] == [[]] * 50
    assert seen["new"] == ["q"] and seen["memory"] == ["q"]
    assert seen["q"] == 53
    assert seen["hidden"] is None


def test_the_cache_of_an_exchange_deleted_before_a_restart_is_dropped(store_url, tmp_path):
    seen = {}

    def first(vhost):
        declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
        bind(vhost, "d", declare_queue(vhost, "q", durable=True))
        publish(vhost, "a")
        vhost.delete_exchange("d")

    def second(vhost):
        cq = vhost.queues.get(cache_queue_name("d"))
        seen["left"] = None if cq is None else cq.message_count
        x = declare_exchange(vhost, "d", "x-message-deduplication", durable=True, arguments=DISK)
        bind(vhost, "d", vhost.queues["q"])
        seen["routed"] = publish(vhost, "a")
        seen["cached"] = x.cached

    _life(store_url, tmp_path / "data", first)
    _life(store_url, tmp_path / "data", second)
    assert seen["left"] in (None, 0)
    assert seen["routed"] == ["q"] and seen["cached"] == 1
