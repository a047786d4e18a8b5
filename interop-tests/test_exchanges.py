"""Exchange class and routing semantics."""
from __future__ import annotations

import pika
import pika.exceptions
import pytest
from helpers import assert_channel_error, assert_empty, drain, get_one


def _q(ch):
    return ch.queue_declare("", exclusive=True).method.queue


def test_default_exchange_routes_by_queue_name(ch):
    q = _q(ch)
    ch.basic_publish("", q, b"hello")
    m, p, b = get_one(ch, q)
    assert b == b"hello" and m.exchange == "" and m.routing_key == q


def test_default_exchange_bind_forbidden(ch):
    q = _q(ch)
    assert_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.queue_bind, q, "", "foo")


def test_default_exchange_delete_forbidden(ch):
    assert_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_delete, "")


@pytest.mark.parametrize("name,etype", [
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
    ("amq.headers", "headers"), ("amq.match", "headers"),
])
def test_predeclared_exchanges_exist(ch, name, etype):
    ch.exchange_declare(name, passive=True)
    # redeclaring with the same properties is allowed ...
    ch.exchange_declare(name, etype, durable=True)


def test_predeclared_exchange_redeclare_other_type_refused(ch):
    # an existing amq.* exchange is checked for equivalence (406), not refused (403)
    assert_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': "
                              "received 'fanout' but current is 'direct'",
                         ch.exchange_declare, "amq.direct", "fanout", durable=True)


def test_declare_amq_prefix_refused(ch):
    assert_channel_error(403, "ACCESS_REFUSED - exchange name 'amq.itest' contains reserved prefix 'amq.*'",
                         ch.exchange_declare, "amq.itest", "topic")


def test_passive_missing_exchange(ch, uid):
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}' in vhost '/'",
                         ch.exchange_declare, uid, passive=True)


def _setup(ch, cleanup, uid, etype, bindings, **kw):
    """Declare exchange + one exclusive queue per binding key; returns (exchange, {key: queue})."""
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, etype, auto_delete=False, **kw)
    queues = {}
    for key, args in bindings:
        q = _q(ch)
        ch.queue_bind(q, ex, key, arguments=args)
        queues[(key, repr(args))] = q
    return ex, queues


def _who_got(ch, queues, settle_conn):
    settle_conn.sleep(0.15)
    got = set()
    for k, q in queues.items():
        msgs = drain(ch, q)
        if msgs:
            got.add(k)
    return got


def _publish_confirmed(ch, ex, rk, headers=None):
    """Publish with confirms+mandatory; return True if routed to at least one queue."""
    try:
        ch.basic_publish(ex, rk, b"m", pika.BasicProperties(headers=headers), mandatory=True)
        return True
    except pika.exceptions.UnroutableError:
        return False


def test_direct_exchange(ch, cleanup, uid):
    ch.confirm_delivery()
    ex, qs = _setup(ch, cleanup, uid, "direct", [("a", None), ("b", None), ("a", {"x": 1})])
    assert _publish_confirmed(ch, ex, "a")
    assert _who_got(ch, qs, ch.connection) == {("a", "None"), ("a", "{'x': 1}")}
    assert _publish_confirmed(ch, ex, "b")
    assert _who_got(ch, qs, ch.connection) == {("b", "None")}
    assert not _publish_confirmed(ch, ex, "c")
    assert not _publish_confirmed(ch, ex, "A")  # case sensitive


def test_fanout_exchange_ignores_routing_key(ch, cleanup, uid):
    ch.confirm_delivery()
    ex, qs = _setup(ch, cleanup, uid, "fanout", [("a", None), ("zzz", None), ("", None)])
    assert _publish_confirmed(ch, ex, "whatever")
    assert len(_who_got(ch, qs, ch.connection)) == 3


TOPIC_CASES = [
    # (binding, routing key, matches)
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", "", False),           # RabbitMQ: the empty key has no words for '*'
    ("#.*", "", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("#", "a", True),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "ab", False),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.b.cc", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("*.*", "a", False),
    ("*.*", "a.", True),       # empty trailing word
    ("a..b", "a..b", True),    # empty middle word
    ("a.*.b", "a..b", True),   # * matches an empty word
    ("a.#.#.b", "a.b", True),
    ("#.#", "x.y", True),
    ("*.b.#", "a.b", True),
    ("*.b.#", "b", False),
]


@pytest.mark.parametrize("binding,rk,matches", TOPIC_CASES)
def test_topic_matching(ch, cleanup, uid, binding, rk, matches):
    ch.confirm_delivery()
    ex, qs = _setup(ch, cleanup, uid, "topic", [(binding, None)])
    assert _publish_confirmed(ch, ex, rk) is matches


def test_topic_multiple_bindings_single_copy(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "topic")
    q = _q(ch)
    for key in ("a.*", "a.#", "#", "a.b"):
        ch.queue_bind(q, ex, key)
    ch.basic_publish(ex, "a.b", b"once")
    get_one(ch, q)
    assert_empty(ch, q)


HEADERS_CASES = [
    # (binding args, message headers, matches)
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1}, {"a": 2}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1}, {}, False),
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),      # default is all
    ({"a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all"}, {"anything": 1}, True),         # no conditions: all matches
    ({"x-match": "all"}, {}, True),
    ({"x-match": "any"}, {"anything": 1}, False),        # no conditions: any never matches
    # x-* binding arguments are ignored by all/any: here there are no conditions left
    ({"x-match": "all", "x-foo": "1"}, {"x-foo": "1"}, True),
    ({"x-match": "all", "x-foo": "1"}, {"x-foo": "2"}, True),
    ({"x-match": "any", "x-foo": "1"}, {"x-foo": "1"}, False),
    ({"x-match": "all", "x-foo": "1", "a": 1}, {"a": 1}, True),
    # ... but not by all-with-x / any-with-x (RabbitMQ >= 3.10)
    ({"x-match": "all-with-x", "x-foo": "1"}, {"x-foo": "1"}, True),
    ({"x-match": "any-with-x", "x-foo": "1", "a": 2}, {"x-foo": "1"}, True),
    ({"x-match": "any-with-x", "x-foo": "1"}, {"x-foo": "2"}, False),
    ({"x-match": "all-with-x", "x-foo": "1", "a": 1}, {"x-foo": "1"}, False),
    ({"x-match": "all-with-x", "x-foo": "1"}, {"x-foo": "2"}, False),
    ({"x-match": "all", "a": 1}, None, False),          # no headers at all
]


@pytest.mark.parametrize("args,headers,matches", HEADERS_CASES)
def test_headers_matching(ch, cleanup, uid, args, headers, matches):
    ch.confirm_delivery()
    ex, qs = _setup(ch, cleanup, uid, "headers", [("", args)])
    assert _publish_confirmed(ch, ex, "ignored", headers) is matches


def test_headers_invalid_x_match(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "headers")
    q = _q(ch)
    assert_channel_error(406, "PRECONDITION_FAILED - Invalid x-match field value <<\"bogus\">>; expected all, any, all-with-x, or any-with-x",
                         ch.queue_bind, q, ex, "", arguments={"x-match": "bogus"})


def test_exchange_durable_and_redeclare_equivalence(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct", durable=True)
    ch.exchange_declare(ex, "direct", durable=True)  # same again is fine
    ch.exchange_declare(ex, passive=True)
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{uid}' in vhost '/': "
             "received 'false' but current is 'true'",
        ch.exchange_declare, ex, "direct", durable=False)


def test_exchange_redeclare_other_type(conn, cleanup, uid):
    ch = conn.channel()
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct")
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{uid}' in vhost '/': "
             "received 'fanout' but current is 'direct'",
        ch.exchange_declare, ex, "fanout")
    ch = conn.channel()
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange '{uid}' in vhost '/': "
             "received 'true' but current is 'false'",
        ch.exchange_declare, ex, "direct", auto_delete=True)
    ch = conn.channel()
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'internal' for exchange '{uid}' in vhost '/': "
             "received 'true' but current is 'false'",
        ch.exchange_declare, ex, "direct", internal=True)


def test_exchange_redeclare_other_alternate_exchange(conn, cleanup, uid):
    ch = conn.channel()
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct", arguments={"alternate-exchange": "ae1"})
    ch.exchange_declare(ex, "direct", arguments={"alternate-exchange": "ae1"})
    assert_channel_error(
        406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{uid}' in vhost '/': "
             "received 'ae2' but current is 'ae1'",
        ch.exchange_declare, ex, "direct", arguments={"alternate-exchange": "ae2"})


def test_exchange_auto_delete_when_last_binding_removed(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct", auto_delete=True)
    q1, q2 = _q(ch), _q(ch)
    ch.queue_bind(q1, ex, "k")
    ch.queue_bind(q2, ex, "k")
    ch.queue_unbind(q1, ex, "k")
    ch.exchange_declare(ex, passive=True)  # still there: one binding left
    ch.queue_unbind(q2, ex, "k")
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}' in vhost '/'",
                         ch.exchange_declare, ex, passive=True)


def test_exchange_auto_delete_not_deleted_without_bindings(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "fanout", auto_delete=True)
    ch.connection.sleep(0.2)
    ch.exchange_declare(ex, passive=True)  # never bound -> stays


def test_exchange_auto_delete_when_bound_queue_deleted(conn, cleanup, uid):
    ch = conn.channel()
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct", auto_delete=True)
    q = _q(ch)
    ch.queue_bind(q, ex, "k")
    ch.queue_delete(q)
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}' in vhost '/'",
                         ch.exchange_declare, ex, passive=True)


def test_internal_exchange_publish_refused(conn, cleanup, uid):
    ch = conn.channel()
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "fanout", internal=True)
    ch.basic_publish(ex, "", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 403
    assert ei.value.reply_text == f"ACCESS_REFUSED - cannot publish to internal exchange '{uid}' in vhost '/'"


def test_internal_exchange_reachable_via_e2e_binding(ch, cleanup, uid):
    src = cleanup.exchange(uid + "-src")
    dst = cleanup.exchange(uid + "-int")
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(dst, "fanout", internal=True)
    ch.exchange_bind(dst, src, "")
    q = _q(ch)
    ch.queue_bind(q, dst, "")
    ch.basic_publish(src, "k", b"via-internal")
    m, p, b = get_one(ch, q)
    assert b == b"via-internal" and m.exchange == src


def test_delete_if_unused(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct")
    q = _q(ch)
    ch.queue_bind(q, ex, "k")
    assert_channel_error(406, f"PRECONDITION_FAILED - exchange '{uid}' in vhost '/' in use",
                         ch.exchange_delete, ex, if_unused=True)


def test_delete_if_unused_ok_when_unbound(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct")
    ch.exchange_delete(ex, if_unused=True)
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}' in vhost '/'",
                         ch.exchange_declare, ex, passive=True)


def test_delete_missing_exchange_is_ok(ch, uid):
    ch.exchange_delete(uid)  # RabbitMQ 3.x: idempotent, no 404


def test_exchange_to_exchange_bind_unbind(ch, cleanup, uid):
    src = cleanup.exchange(uid + "-src")
    dst = cleanup.exchange(uid + "-dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    ch.exchange_bind(dst, src, "a.*")
    q = _q(ch)
    ch.queue_bind(q, dst, "a.b")
    ch.basic_publish(src, "a.b", b"e2e")
    m, p, b = get_one(ch, q)
    assert (b, m.exchange, m.routing_key) == (b"e2e", src, "a.b")
    ch.basic_publish(src, "a.c", b"no")  # passes src, not dst binding
    assert_empty(ch, q)
    ch.exchange_unbind(dst, src, "a.*")
    ch.basic_publish(src, "a.b", b"after-unbind")
    assert_empty(ch, q)


def test_exchange_bind_missing_source(ch, cleanup, uid):
    dst = cleanup.exchange(uid)
    ch.exchange_declare(dst, "direct")
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}-missing' in vhost '/'",
                         ch.exchange_bind, dst, uid + "-missing", "k")


def test_exchange_to_exchange_cycle_delivers_once(ch, cleanup, uid):
    a = cleanup.exchange(uid + "-a")
    b = cleanup.exchange(uid + "-b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a, "")
    ch.exchange_bind(a, b, "")
    q = _q(ch)
    ch.queue_bind(q, a, "")
    ch.queue_bind(q, b, "")
    ch.basic_publish(a, "", b"cycle")
    assert get_one(ch, q)[2] == b"cycle"
    assert_empty(ch, q)


def test_alternate_exchange(ch, cleanup, uid):
    ae = cleanup.exchange(uid + "-ae")
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(ex, "direct", arguments={"alternate-exchange": ae})
    q_main, q_ae = _q(ch), _q(ch)
    ch.queue_bind(q_main, ex, "known")
    ch.queue_bind(q_ae, ae, "")
    ch.confirm_delivery()
    # mandatory publish that only reaches the AE counts as routed (no basic.return)
    ch.basic_publish(ex, "unknown", b"to-ae", mandatory=True)
    ch.basic_publish(ex, "known", b"to-main", mandatory=True)
    m, p, b = get_one(ch, q_ae)
    assert (b, m.exchange, m.routing_key) == (b"to-ae", ex, "unknown")
    assert get_one(ch, q_main)[2] == b"to-main"
    assert_empty(ch, q_ae)


def test_alternate_exchange_missing_is_unroutable(ch, cleanup, uid):
    ex = cleanup.exchange(uid)
    ch.exchange_declare(ex, "direct", arguments={"alternate-exchange": uid + "-nonexistent"})
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(ex, "x", b"lost", mandatory=True)


def test_bind_to_missing_exchange_and_queue(ch, uid):
    q = _q(ch)
    assert_channel_error(404, f"NOT_FOUND - no exchange '{uid}' in vhost '/'", ch.queue_bind, q, uid, "k")


def test_bind_missing_queue(ch, uid):
    assert_channel_error(404, f"NOT_FOUND - no queue '{uid}' in vhost '/'", ch.queue_bind, uid, "amq.direct", "k")


def test_unbind_nonexistent_binding_is_ok(ch):
    q = _q(ch)
    ch.queue_unbind(q, "amq.direct", "never-bound")
