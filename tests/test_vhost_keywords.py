"""The vhost's declare/delete API in plain keywords (no AMQP method objects): the same
queues and exchanges, the same refusals (RabbitMQ's codes and texts) as queue.declare and
exchange.declare frames got, the vhost's default queue type applied alike."""
from __future__ import annotations

from broker.queues.types import QUEUE_TYPES

from .support import amqp_error

OWNER = object()


def test_queue_declare_and_delete_in_keywords(vhost):
    q = vhost.declare_queue("k", durable=True, arguments={"x-max-length": 3})
    assert (q.name, q.durable, q.exclusive_owner, q.auto_delete) == ("k", True, None, False)
    assert vhost.declare_queue("k", durable=True, arguments={"x-max-length": 3}) is q
    assert vhost.declare_queue("k", passive=True) is q
    with amqp_error(406, "inequivalent arg 'durable'"):
        vhost.declare_queue("k", durable=False, arguments={"x-max-length": 3})
    named = vhost.declare_queue("", OWNER, exclusive=True)
    assert named.name.startswith("amq.gen-") and named.exclusive_owner is OWNER
    with amqp_error(405):  # another connection's exclusive queue
        vhost.declare_queue(named.name, object(), passive=True)
    with amqp_error(404):
        vhost.declare_queue("absent", passive=True)
    with amqp_error(403, "reserved prefix"):
        vhost.declare_queue("amq.q")
    names = []
    q2 = vhost.declare_queue("checked", authorize=names.append)
    assert names == ["checked"]
    vhost.bind("amq.direct", q2, "r", {})
    assert vhost.delete_queue_checked("checked", None, if_empty=True) == 0
    assert vhost.find_queue("checked") is None


def test_exchange_declare_and_delete_in_keywords(vhost):
    x = vhost.declare_exchange("e", "topic", durable=True, arguments={})
    assert (x.type_name, x.durable, x.internal) == ("topic", True, False)
    assert vhost.declare_exchange("e", "topic", durable=True) is x
    assert vhost.declare_exchange("e", passive=True) is x
    with amqp_error(406, "inequivalent arg 'type'"):
        vhost.declare_exchange("e", "fanout", durable=True)
    with amqp_error(503, "unknown exchange type"):
        vhost.declare_exchange("f", "no-such-type")
    q = vhost.declare_queue("bound")
    vhost.bind("e", q, "#", {})
    with amqp_error(406, "in use"):
        vhost.delete_exchange("e", if_unused=True)
    vhost.delete_exchange("e")
    assert "e" not in vhost.exchanges


def test_the_default_queue_type_applies_to_keyword_declares(vhost):
    vhost.default_queue_type = "quorum"
    assert vhost.declare_queue("durable-one", durable=True).queue_type is QUEUE_TYPES["quorum"]
    # as RabbitMQ: not where quorum refuses the declare's properties (transient, exclusive)
    assert vhost.declare_queue("transient-one").queue_type is QUEUE_TYPES["classic"]
    assert vhost.declare_queue("", OWNER, exclusive=True, durable=True).queue_type \
        is QUEUE_TYPES["classic"]


def test_no_caller_builds_amqp_methods_to_talk_to_the_vhost():
    """Only the AMQP 0-9-1 edge parses methods (and unpacks them into keywords); the
    cluster's link sends real ones to another node. Nothing fakes a frame for the core."""
    import inspect
    import pathlib
    import re

    from broker.vhost import VirtualHost

    for meth in ("declare_queue", "declare_exchange", "delete_exchange", "delete_queue_checked"):
        assert inspect.signature(getattr(VirtualHost, meth)).parameters["name"].annotation \
            == "str", meth
    root = pathlib.Path(__file__).resolve().parent.parent / "broker"
    allowed = {"amqp", "cluster/forward.py", "cluster/store.py"}
    fake = re.compile(r"spec\.(Queue|Exchange)\.(Declare|Delete)\(|SimpleNamespace\(\s*(queue|exchange)=")
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if not any(str(p.relative_to(root)).startswith(a) for a in allowed)
             and fake.search(p.read_text())]
    assert found == []
