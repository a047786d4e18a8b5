"""VirtualHost: declarations and their equivalence checks (RabbitMQ's reply codes and texts),
bindings, exclusive ownership, auto-delete, and routing across exchanges."""
from __future__ import annotations

import pytest

from broker.amqp import spec
from broker.amqp.fields import Long

from .support import amqp_error, bind, declare_exchange, declare_queue, make_message, unbind

OWNER, OTHER = object(), object()  # two connections


def routed(vhost, exchange, key="", **props):
    return sorted(q.name for q in vhost.route(exchange, key, make_message(exchange=exchange,
                                                                          routing_key=key, **props)))


# ---- exchanges ----------------------------------------------------------------------------

def test_standard_exchanges(vhost):
    types = {name: x.type_name for name, x in vhost.exchanges.items()}
    assert types == {"": "direct", "amq.direct": "direct", "amq.fanout": "fanout",
                     "amq.topic": "topic", "amq.headers": "headers", "amq.match": "headers"}
    assert all(x.durable for x in vhost.exchanges.values())


def test_redeclare_exchange_same_properties_returns_it(vhost):
    x = declare_exchange(vhost, "e", "topic", durable=True)
    assert declare_exchange(vhost, "e", "topic", durable=True) is x


@pytest.mark.parametrize(("fields", "arg", "received", "current"), [
    ({"type": "fanout"}, "type", "fanout", "direct"),
    ({"durable": True}, "durable", "true", "false"),
    ({"auto_delete": True}, "auto_delete", "true", "false"),
    ({"internal": True}, "internal", "true", "false"),
])
def test_exchange_equivalence(vhost, fields, arg, received, current):
    declare_exchange(vhost, "e", "direct")
    kind = fields.pop("type", "direct")
    with amqp_error(spec.PRECONDITION_FAILED,
                    f"inequivalent arg '{arg}' for exchange 'e' in vhost '/': "
                    f"received '{received}' but current is '{current}'"):
        declare_exchange(vhost, "e", kind, **fields)


def test_exchange_alternate_exchange_equivalence(vhost):
    declare_exchange(vhost, "e", "direct", arguments={"alternate-exchange": "ae"})
    declare_exchange(vhost, "e", "direct", arguments={"alternate-exchange": b"ae"})  # same text
    with amqp_error(spec.PRECONDITION_FAILED, "received none but current is 'ae'"):
        declare_exchange(vhost, "e", "direct")


def test_exchange_declare_refusals(vhost):
    with amqp_error(spec.ACCESS_REFUSED, "default exchange"):
        declare_exchange(vhost, "", "direct")
    with amqp_error(spec.ACCESS_REFUSED, "reserved prefix 'amq.*'"):
        declare_exchange(vhost, "amq.mine", "direct")
    with amqp_error(spec.COMMAND_INVALID, "unknown exchange type 'nope'"):
        declare_exchange(vhost, "e", "nope")
    assert "e" not in vhost.exchanges
    # an existing amq.* exchange may be redeclared with its own properties
    assert declare_exchange(vhost, "amq.topic", "topic", durable=True) is vhost.exchanges["amq.topic"]


def test_exchange_passive(vhost):
    with amqp_error(spec.NOT_FOUND, "no exchange 'missing' in vhost '/'"):
        declare_exchange(vhost, "missing", passive=True)
    assert declare_exchange(vhost, "", passive=True) is vhost.exchanges[""]
    x = declare_exchange(vhost, "e", "fanout")
    assert declare_exchange(vhost, "e", "topic", passive=True) is x  # type not checked


def test_delete_exchange(vhost):
    declare_exchange(vhost, "e", "fanout")
    q = declare_queue(vhost, "q")
    bind(vhost, "e", q)
    with amqp_error(spec.PRECONDITION_FAILED, "exchange 'e' in vhost '/' in use"):
        vhost.delete_exchange("e", if_unused=True)
    vhost.delete_exchange("e")
    assert "e" not in vhost.exchanges
    assert q.bindings == set()
    vhost.delete_exchange("e")  # idempotent
    with amqp_error(spec.ACCESS_REFUSED, "deletion of system exchange 'amq.direct'"):
        vhost.delete_exchange("amq.direct")
    with amqp_error(spec.ACCESS_REFUSED):
        vhost.delete_exchange("")


def test_deleting_a_destination_exchange_removes_bindings_to_it(vhost):
    declare_exchange(vhost, "src", "fanout")
    dst = declare_exchange(vhost, "dst", "fanout")
    bind(vhost, "src", dst)
    vhost.delete_exchange("dst")
    assert not vhost.exchanges["src"].has_bindings


def test_auto_delete_exchange_goes_with_its_last_binding(vhost):
    declare_exchange(vhost, "ad", "direct", auto_delete=True)
    q = declare_queue(vhost, "q")
    bind(vhost, "ad", q, "a")
    bind(vhost, "ad", q, "b")
    unbind(vhost, "ad", q, "a")
    assert "ad" in vhost.exchanges
    unbind(vhost, "ad", q, "b")
    assert "ad" not in vhost.exchanges


def test_auto_delete_exchange_goes_when_its_queue_is_deleted(vhost):
    declare_exchange(vhost, "ad", "fanout", auto_delete=True)
    q = declare_queue(vhost, "q")
    bind(vhost, "ad", q)
    vhost.delete_queue(q)
    assert "ad" not in vhost.exchanges


# ---- queues -------------------------------------------------------------------------------
def test_server_named_queue(vhost):
    q = declare_queue(vhost, "")
    assert q.name.startswith("amq.gen-") and len(q.name) > len("amq.gen-") + 10
    assert vhost.queues[q.name] is q
    assert declare_queue(vhost, "").name != q.name


def test_queue_declare_refusals(vhost):
    with amqp_error(spec.ACCESS_REFUSED, "queue name 'amq.q' contains reserved prefix 'amq.*'"):
        declare_queue(vhost, "amq.q")
    with amqp_error(spec.NOT_FOUND, "no queue 'missing' in vhost '/'"):
        declare_queue(vhost, "missing", passive=True)
    with amqp_error(spec.NOT_FOUND):
        declare_queue(vhost, "", passive=True)


@pytest.mark.parametrize(("first", "second", "text"), [
    ({"durable": True}, {}, "inequivalent arg 'durable' for queue 'q' in vhost '/': "
                            "received 'false' but current is 'true'"),
    ({}, {"auto_delete": True}, "inequivalent arg 'auto_delete' for queue 'q' in vhost '/': "
                                "received 'true' but current is 'false'"),
    ({"arguments": {"x-max-length": 10}}, {"arguments": {"x-max-length": 11}},
     "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received '11' but current is '10'"),
    ({"arguments": {"x-message-ttl": 10}}, {},
     "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received none but current is "
     "the value '10' of type 'signedint'"),
])
def test_queue_equivalence(vhost, first, second, text):
    declare_queue(vhost, "q", **first)
    with amqp_error(spec.PRECONDITION_FAILED, text):
        declare_queue(vhost, "q", **second)


def test_queue_redeclare_ignores_unchecked_arguments(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 5, "x-custom": "a"})
    assert declare_queue(vhost, "q", arguments={"x-max-length": Long(5), "x-custom": "b"}) is q


@pytest.mark.parametrize(("arguments", "text"), [
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
    ({"x-overflow": "nope"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"),
    ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
    ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg 'x-dead-letter-exchange'"),
])
def test_invalid_queue_arguments(vhost, arguments, text):
    with amqp_error(spec.PRECONDITION_FAILED, text):
        declare_queue(vhost, "q", arguments=arguments)
    assert "q" not in vhost.queues


def test_exclusive_queue_belongs_to_its_connection(vhost):
    q = declare_queue(vhost, "ex", owner=OWNER, exclusive=True)
    assert q.exclusive_owner is OWNER
    assert declare_queue(vhost, "ex", owner=OWNER, exclusive=True) is q
    with amqp_error(spec.RESOURCE_LOCKED, "cannot obtain exclusive access to locked queue 'ex'"):
        declare_queue(vhost, "ex", owner=OTHER, exclusive=True)
    with amqp_error(spec.RESOURCE_LOCKED):
        declare_queue(vhost, "ex", owner=OTHER, passive=True)
    with amqp_error(spec.RESOURCE_LOCKED):
        vhost.get_queue("ex", OTHER)
    with amqp_error(spec.RESOURCE_LOCKED):
        vhost.delete_queue_checked("ex", OTHER)
    # the owner redeclaring it non-exclusive is refused too
    with amqp_error(spec.RESOURCE_LOCKED):
        declare_queue(vhost, "ex", owner=OWNER)
    assert vhost.get_queue("ex", OWNER) is q


def test_exclusive_queue_skips_the_durable_check(vhost):
    q = declare_queue(vhost, "ex", owner=OWNER, exclusive=True, durable=True)
    assert declare_queue(vhost, "ex", owner=OWNER, exclusive=True) is q


def test_non_exclusive_queue_cannot_be_redeclared_exclusive(vhost):
    declare_queue(vhost, "q")
    with amqp_error(spec.RESOURCE_LOCKED):
        declare_queue(vhost, "q", owner=OWNER, exclusive=True)


def test_drop_owner_deletes_only_that_connections_exclusive_queues(vhost):
    declare_queue(vhost, "mine", owner=OWNER, exclusive=True)
    declare_queue(vhost, "theirs", owner=OTHER, exclusive=True)
    declare_queue(vhost, "shared", owner=OWNER)
    vhost.drop_owner(OWNER)
    assert sorted(vhost.queues) == ["shared", "theirs"]


def test_delete_queue_checked(vhost):
    q = declare_queue(vhost, "q")
    q.enqueue(make_message())
    with amqp_error(spec.PRECONDITION_FAILED, "queue 'q' in vhost '/' not empty"):
        vhost.delete_queue_checked("q", None, if_empty=True)
    assert vhost.delete_queue_checked("q", None) == 1
    assert q.deleted and "q" not in vhost.queues
    assert vhost.delete_queue_checked("q", None) == 0  # idempotent


def test_deleted_queue_callbacks_get_its_consumers(vhost):
    seen = []
    vhost.on_queue_deleted.append(lambda q, consumers: seen.append((q.name, consumers)))
    q = declare_queue(vhost, "q")
    vhost.delete_queue(q)
    assert seen == [("q", [])]
    assert vhost.delete_queue(q) == 0  # already gone: no second callback
    assert len(seen) == 1


# ---- bindings -----------------------------------------------------------------------------
def test_bind_is_idempotent_and_tracked_on_the_queue(vhost):
    q = declare_queue(vhost, "q")
    bind(vhost, "amq.direct", q, "k")
    bind(vhost, "amq.direct", q, "k")
    assert len(vhost.exchanges["amq.direct"].bindings) == 1
    assert len(q.bindings) == 1
    assert routed(vhost, "amq.direct", "k") == ["q"]


def test_bind_refusals(vhost):
    q = declare_queue(vhost, "q")
    with amqp_error(spec.ACCESS_REFUSED, "default exchange"):
        bind(vhost, "", q, "q")
    with amqp_error(spec.NOT_FOUND, "no exchange 'nope' in vhost '/'"):
        bind(vhost, "nope", q, "k")
    with amqp_error(spec.PRECONDITION_FAILED, 'Invalid x-match field value <<"some">>'):
        bind(vhost, "amq.headers", q, "", {"x-match": "some"})
    assert not vhost.exchanges["amq.headers"].has_bindings


def test_unbind_is_idempotent(vhost):
    q = declare_queue(vhost, "q")
    bind(vhost, "amq.topic", q, "a.*")
    unbind(vhost, "amq.topic", q, "a.*")
    assert routed(vhost, "amq.topic", "a.b") == []
    assert q.bindings == set()
    # missing binding, exchange or queue: not errors
    unbind(vhost, "amq.topic", q, "a.*")
    unbind(vhost, "no-such-exchange", q, "a.*")
    unbind(vhost, "amq.topic", None, "a.*")


def test_unbind_other_connections_exclusive_queue_is_refused(vhost):
    q = declare_queue(vhost, "ex", owner=OWNER, exclusive=True)
    bind(vhost, "amq.fanout", q)
    with amqp_error(spec.RESOURCE_LOCKED):
        unbind(vhost, "amq.fanout", q, owner=OTHER)
    unbind(vhost, "amq.fanout", q, owner=OWNER)
    assert not vhost.exchanges["amq.fanout"].has_bindings


def test_deleting_a_queue_removes_its_bindings(vhost):
    q = declare_queue(vhost, "q")
    bind(vhost, "amq.topic", q, "#")
    bind(vhost, "amq.direct", q, "k")
    vhost.delete_queue(q)
    assert not vhost.exchanges["amq.topic"].has_bindings
    assert not vhost.exchanges["amq.direct"].has_bindings
    assert vhost.exchanges["amq.topic"]._root.children == {}


# ---- routing ------------------------------------------------------------------------------
def test_default_exchange_routes_to_the_queue_named(vhost):
    declare_queue(vhost, "q")
    assert routed(vhost, "", "q") == ["q"]
    assert routed(vhost, "", "other") == []
    assert routed(vhost, "missing-exchange", "q") == []


def test_route_deduplicates_queues(vhost):
    q = declare_queue(vhost, "q")
    for key in ("#", "a.*", "a.b"):
        bind(vhost, "amq.topic", q, key)
    assert routed(vhost, "amq.topic", "a.b") == ["q"]
    declare_exchange(vhost, "d", "direct")
    bind(vhost, "d", q, "k", {"v": 1})
    bind(vhost, "d", q, "k", {"v": 2})
    assert routed(vhost, "d", "k") == ["q"]


def test_exchange_to_exchange_bindings_and_cycles(vhost):
    a = declare_exchange(vhost, "a", "fanout")
    b = declare_exchange(vhost, "b", "topic")
    q = declare_queue(vhost, "q")
    bind(vhost, "a", b)
    bind(vhost, "b", a, "#")  # a cycle: each exchange is visited once
    bind(vhost, "b", q, "x.*")
    assert routed(vhost, "a", "x.y") == ["q"]
    assert routed(vhost, "a", "z") == []
    assert a is vhost.exchanges["a"]


def test_alternate_exchange_only_when_unrouted(vhost):
    declare_exchange(vhost, "main", "direct", arguments={"alternate-exchange": "ae"})
    declare_exchange(vhost, "ae", "fanout")
    hit, lost = declare_queue(vhost, "hit"), declare_queue(vhost, "lost")
    bind(vhost, "main", hit, "k")
    bind(vhost, "ae", lost)
    assert routed(vhost, "main", "k") == ["hit"]
    assert routed(vhost, "main", "other") == ["lost"]
    vhost.delete_exchange("ae")
    assert routed(vhost, "main", "other") == []  # a missing alternate exchange is no error


def test_cc_and_bcc_add_routing_keys(vhost):
    for name in ("a", "b", "c"):
        bind(vhost, "amq.direct", declare_queue(vhost, name), name)
    assert routed(vhost, "amq.direct", "a", headers={"CC": [b"b"], "BCC": ["c"]}) == ["a", "b", "c"]
    assert routed(vhost, "", "a", headers={"CC": [b"b"]}) == ["a", "b"]
    assert routed(vhost, "amq.direct", "a", headers={"CC": "b"}) == ["a"]  # must be an array


def test_headers_exchange_through_the_vhost(vhost):
    q = declare_queue(vhost, "q")
    bind(vhost, "amq.match", q, "", {"x-match": "any-with-x", "x-kind": "k1"})
    assert routed(vhost, "amq.match", "", headers={"x-kind": "k1"}) == ["q"]
    assert routed(vhost, "amq.match", "", headers={"x-kind": "k2"}) == []
    assert routed(vhost, "amq.match", "") == []
