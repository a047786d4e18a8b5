"""Policies acting on queues and exchanges: real AMQP frames through a Session
(``session_client``), on the fake clock. Expected behaviour is RabbitMQ 3.10's, as
observed on the machine's RabbitMQ (interop-tests/test_policies.py compares both)."""
from __future__ import annotations

import pytest

from broker.amqp import spec
from broker.policies import PolicyError, PolicyNotFound, VhostNotFound

from ..support import channel_close, methods


@pytest.fixture
def c(session_client):
    client = session_client()
    client.open_channel(1)
    return client


def declare(c, name, **args):
    c.declare_queue(1, name, arguments=args)
    return c.broker.vhosts["/"].queues[name]


def publish(c, queue, n, exchange="", **props):
    for i in range(n):
        c.publish(1, str(i).encode(), exchange, queue, **props)


def count(c, name):
    return c.broker.vhosts["/"].queues[name].message_count


def bodies(c, name):
    q = c.broker.vhosts["/"].queues[name]
    return [e.message.body for e in q.ready]


def dlx(c, exchange="dlx", queue="dead"):
    c.ok(1, spec.Exchange.Declare(exchange=exchange, type="fanout"), spec.Exchange.DeclareOk)
    c.declare_queue(1, queue)
    c.ok(1, spec.Queue.Bind(queue=queue, exchange=exchange), spec.Queue.BindOk)


def test_lower_max_length_drops_the_head_into_the_dlx_at_once(c):
    dlx(c)
    declare(c, "ml")
    publish(c, "ml", 10)
    c.broker.policies.set_policy("/", "p", "^ml$", {"max-length": 3, "dead-letter-exchange": "dlx"},
                                 apply_to="queues")
    assert bodies(c, "ml") == [b"7", b"8", b"9"]
    assert count(c, "dead") == 7
    head = c.broker.vhosts["/"].queues["dead"].ready.peek().message
    assert head.headers["x-death"][0]["reason"] == b"maxlen"
    c.broker.policies.clear_policy("/", "p")  # back to unlimited
    publish(c, "ml", 10)
    assert count(c, "ml") == 13


def test_lowered_max_length_keeps_messages_of_a_reject_publish_queue(c):
    declare(c, "rp", **{"x-overflow": "reject-publish"})
    publish(c, "rp", 10)
    c.broker.policies.set_policy("/", "p", "^rp", {"max-length": 3})
    assert count(c, "rp") == 10
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    written = c.publish(1, b"x", "", "rp") + c.output()
    assert methods(written, spec.Basic.Nack)
    assert count(c, "rp") == 10


@pytest.mark.parametrize("arg, policy, expected", [(5, 3, 3), (2, 3, 2)])
def test_numeric_limits_take_the_lower_of_argument_and_policy(c, arg, policy, expected):
    declare(c, "q", **{"x-max-length": arg})
    c.broker.policies.set_policy("/", "p", "q", {"max-length": policy})
    publish(c, "q", 10)
    assert count(c, "q") == expected


def test_the_queues_dead_letter_exchange_argument_wins_over_the_policy(c):
    dlx(c, "dlxa", "dla")
    dlx(c, "dlxp", "dlp")
    declare(c, "dq", **{"x-dead-letter-exchange": "dlxa", "x-max-length": 1})
    c.broker.policies.set_policy("/", "p", "^dq$", {"dead-letter-exchange": "dlxp"})
    publish(c, "dq", 3)
    assert (count(c, "dla"), count(c, "dlp"), count(c, "dq")) == (2, 0, 1)


def test_overflow_argument_wins_over_the_policy(c):
    q = declare(c, "ov", **{"x-overflow": "drop-head"})
    c.broker.policies.set_policy("/", "p", "^ov", {"overflow": "reject-publish", "max-length": 2})
    assert q.opts.overflow == "drop-head"
    publish(c, "ov", 5)
    assert bodies(c, "ov") == [b"3", b"4"]


def test_operator_policy_caps_arguments_and_policies(c):
    pol = c.broker.policies
    pol.set_operator_policy("/", "o-cap", "^op", {"max-length": 4}, apply_to="queues")
    pol.set_policy("/", "p-op", "^op", {"max-length": 6})
    declare(c, "op1")
    declare(c, "op2", **{"x-max-length": 8})
    declare(c, "op3", **{"x-max-length": 2})
    for q in ("op1", "op2", "op3"):
        publish(c, q, 10)
    assert [count(c, q) for q in ("op1", "op2", "op3")] == [4, 4, 2]
    assert pol.effective("/", "queue", "op2") == ("p-op", "o-cap", {"max-length": 4})
    q = c.broker.vhosts["/"].queues["op2"]
    assert (q.policy, q.operator_policy, q.effective_policy_definition) == \
        ("p-op", "o-cap", {"max-length": 4})
    assert q.arguments == {"x-max-length": 8}  # what the client declared stays as it was
    pol.clear_operator_policy("/", "o-cap")
    assert pol.effective("/", "queue", "op2") == ("p-op", None, {"max-length": 6})
    publish(c, "op1", 10)
    assert count(c, "op1") == 6


def test_the_highest_priority_policy_wins_alone(c):
    pol = c.broker.policies
    pol.set_policy("/", "lo", "^pq$", {"max-length": 2, "message-ttl": 100000}, priority=1)
    pol.set_policy("/", "hi", "^pq$", {"max-length": 5}, priority=2)
    q = declare(c, "pq")
    publish(c, "pq", 10)
    assert count(c, "pq") == 5
    assert q.opts.message_ttl is None  # no merging with the lower policy
    assert pol.effective("/", "queue", "pq") == ("hi", None, {"max-length": 5})
    pol.clear_policy("/", "hi")
    assert q.policy == "lo" and count(c, "pq") == 2


def test_a_new_message_ttl_applies_to_new_messages(c, clock):
    # RabbitMQ computes a message's expiry when it is enqueued: older messages keep theirs
    declare(c, "ttl")
    publish(c, "ttl", 3)
    c.broker.policies.set_policy("/", "p", "^ttl$", {"message-ttl": 100})
    clock.advance(1)
    assert count(c, "ttl") == 3
    declare(c, "ttl2")
    c.broker.policies.set_policy("/", "p", "^ttl", {"message-ttl": 100})
    publish(c, "ttl2", 3)
    clock.advance(0.2)
    assert count(c, "ttl2") == 0


def test_expires_restarts_the_idle_timer_when_the_policy_comes(c, clock):
    declare(c, "exq")
    clock.advance(5)
    c.broker.policies.set_policy("/", "p", "^exq$", {"expires": 600})
    clock.advance(0.3)
    assert "exq" in c.broker.vhosts["/"].queues
    clock.advance(0.4)
    assert "exq" not in c.broker.vhosts["/"].queues


def test_clearing_expires_cancels_the_idle_timer(c, clock):
    declare(c, "exq")
    c.broker.policies.set_policy("/", "p", "^exq$", {"expires": 600})
    c.broker.policies.clear_policy("/", "p")
    clock.advance(5)
    assert "exq" in c.broker.vhosts["/"].queues


def test_a_changed_dead_letter_exchange_serves_the_next_dead_letters(c):
    dlx(c, "dlx1", "dead1")
    dlx(c, "dlx2", "dead2")
    declare(c, "work")
    c.broker.policies.set_policy("/", "p", "^work$", {"dead-letter-exchange": "dlx1"})
    publish(c, "work", 2)
    for expected in ("dead1", "dead2"):
        got = c.call(1, spec.Basic.Get(queue="work"))
        c.call(1, spec.Basic.Reject(got[0].method.delivery_tag, requeue=False))
        assert count(c, expected) == 1
        c.broker.policies.set_policy("/", "p", "^work$", {"dead-letter-exchange": "dlx2"})


def test_alternate_exchange_policy_applies_to_the_next_publish(c):
    c.ok(1, spec.Exchange.Declare(exchange="ae", type="fanout"), spec.Exchange.DeclareOk)
    c.declare_queue(1, "aeq")
    c.ok(1, spec.Queue.Bind(queue="aeq", exchange="ae"), spec.Queue.BindOk)
    c.ok(1, spec.Exchange.Declare(exchange="main", type="direct"), spec.Exchange.DeclareOk)
    c.publish(1, b"lost", "main", "nokey")
    pol = c.broker.policies
    pol.set_policy("/", "p", "^main$", {"alternate-exchange": "ae"}, apply_to="exchanges")
    c.publish(1, b"kept", "main", "nokey")
    assert bodies(c, "aeq") == [b"kept"]
    x = c.broker.vhosts["/"].exchanges["main"]
    assert (x.policy, x.effective_policy_definition) == ("p", {"alternate-exchange": "ae"})
    pol.clear_policy("/", "p")
    c.publish(1, b"lost again", "main", "nokey")
    assert count(c, "aeq") == 1
    # an exchange declared later gets it; its own argument wins
    pol.set_policy("/", "p", "^(main|other)$", {"alternate-exchange": "nowhere"},
                   apply_to="exchanges")
    c.ok(1, spec.Exchange.Declare(exchange="other", type="direct",
                                  arguments={"alternate-exchange": "ae"}), spec.Exchange.DeclareOk)
    c.publish(1, b"via arg", "other", "nokey")
    assert count(c, "aeq") == 2


def test_delivery_limit_policy_dead_letters_after_the_limit(c):
    dlx(c)
    declare(c, "dl", **{"x-dead-letter-exchange": "dlx"})
    c.broker.policies.set_policy("/", "p", "^dl$", {"delivery-limit": 1})
    publish(c, "dl", 1)
    for _ in range(2):
        got = c.call(1, spec.Basic.Get(queue="dl"))
        c.call(1, spec.Basic.Nack(got[0].method.delivery_tag, False, requeue=True))
    assert count(c, "dl") == 0 and count(c, "dead") == 1
    head = c.broker.vhosts["/"].queues["dead"].ready.peek().message
    assert head.headers["x-death"][0]["reason"] == b"delivery_limit"
    c.broker.policies.clear_policy("/", "p")
    assert c.broker.vhosts["/"].queues["dl"].retry is None


def test_apply_to_and_unanchored_patterns(c):
    pol = c.broker.policies
    pol.set_policy("/", "px", "orders", {"max-length": 1}, apply_to="exchanges")
    q = declare(c, "eu.orders.new")
    assert q.policy is None
    pol.set_policy("/", "pq", "orders", {"max-length": 1}, apply_to="queues")
    assert q.policy == "pq"
    assert pol.effective("/", "exchange", "eu.orders.new")[0] == "px"


def test_invalid_policies_change_nothing(c):
    pol = c.broker.policies
    declare(c, "q")
    publish(c, "q", 5)
    with pytest.raises(PolicyError):
        pol.set_policy("/", "p", ".*", {"max-length": 1, "ha-mode": "exactly"})
    with pytest.raises(VhostNotFound):
        pol.set_policy("nope", "p", ".*", {"max-length": 1})
    with pytest.raises(PolicyNotFound):
        pol.clear_policy("/", "p")
    assert pol.list_policies() == [] and count(c, "q") == 5


def test_on_change_callbacks_and_vhost_deletion(c):
    pol = c.broker.policies
    seen = []
    pol.on_change.append(seen.append)
    pol.set_policy("/", "p", ".*", {"audit": True})
    pol.set_operator_policy("/", "o", ".*", {"max-length": 9})
    assert seen == ["/", "/"]
    assert pol.effective("/", "queue", "any") == ("p", "o", {"audit": True, "max-length": 9})
    pol.vhost_deleted("/")
    assert pol.list_policies() == [] and pol.list_operator_policies() == []


def test_a_channel_error_is_not_a_policy_matter(c):
    # queue arguments keep their own validation and equivalence: a policy does not make a
    # redeclaration with other arguments equivalent
    declare(c, "q", **{"x-max-length": 5})
    c.broker.policies.set_policy("/", "p", "q", {"max-length": 3})
    written = c.call(1, spec.Queue.Declare(queue="q", arguments={"x-max-length": 3}))
    assert channel_close(written).reply_code == 406


def test_export_and_all_or_nothing_import(c):
    pol = c.broker.policies
    pol.set_policy("/", "p", "^a", {"max-length": 3}, priority=2, apply_to="queues")
    pol.set_operator_policy("/", "o", "^a", {"max-length": 1})
    exported = pol.export()
    assert exported == {
        "policies": [{"vhost": "/", "name": "p", "pattern": "^a", "apply-to": "queues",
                      "definition": {"max-length": 3}, "priority": 2}],
        "parameters": [{"value": {"pattern": "^a", "definition": {"max-length": 1},
                                  "priority": 0, "apply-to": "all"},
                        "vhost": "/", "component": "operator_policy", "name": "o"}]}
    pol.clear_policy("/", "p")
    pol.clear_operator_policy("/", "o")
    bad = {"policies": exported["policies"] + [
        {"vhost": "/", "name": "bad", "pattern": ".*", "definition": {"max-length": -1}}],
        "parameters": exported["parameters"]}
    with pytest.raises(PolicyError, match=r"maximum length.*policy 'bad'"):
        pol.import_(bad)
    assert pol.list_policies() == [] and pol.list_operator_policies() == []
    with pytest.raises(VhostNotFound):
        pol.import_({"policies": [dict(exported["policies"][0], vhost="elsewhere")]})
    assert pol.import_(exported) == 2
    assert pol.export() == exported
    q = declare(c, "abc")
    assert (q.policy, q.operator_policy) == ("p", "o")


def test_policies_follow_vhosts_of_the_access_control(broker):
    from ..support import declare_queue
    access, pol = broker.access, broker.policies
    access.add_vhost("v1")
    pol.set_policy("v1", "p", "^q", {"max-length": 2})
    pol.set_operator_policy("v1", "o", "^q", {"max-length": 1})
    q = declare_queue(broker.vhosts["v1"], "q1")
    assert (q.policy, q.operator_policy, q.opts.max_length) == ("p", "o", 1)
    assert pol.effective("/", "queue", "q1") == (None, None, {})
    access.delete_vhost("v1")
    assert pol.list_policies() == [] and pol.list_operator_policies() == []
    access.add_vhost("v1")
    assert declare_queue(broker.vhosts["v1"], "q1").policy is None
    with pytest.raises(VhostNotFound):
        pol.set_policy("v2", "p", ".*", {"max-length": 1})


def test_lower_max_length_bytes_drops_the_head(c):
    declare(c, "mb")
    for i in range(5):
        c.publish(1, b"x" * 10 + str(i).encode(), "", "mb")
    c.broker.policies.set_policy("/", "p", "^mb$", {"max-length-bytes": 25})
    assert bodies(c, "mb") == [b"xxxxxxxxxx3", b"xxxxxxxxxx4"]
    c.broker.policies.set_operator_policy("/", "o", "^mb$", {"max-length-bytes": 11})
    assert bodies(c, "mb") == [b"xxxxxxxxxx4"]


def test_apply_to_a_queue_type(c):
    """apply-to classic_queues / quorum_queues (RabbitMQ 3.12+) select queues by type;
    "queues" every queue."""
    c.declare_queue(1, "classic-q")
    c.declare_queue(1, "quorum-q", durable=True, arguments={"x-queue-type": "quorum"})
    policies = c.broker.policies
    policies.set_policy("/", "qq", "-q$", {"max-length": 1}, apply_to="quorum_queues")
    queues = c.broker.vhosts["/"].queues
    assert queues["quorum-q"].policy == "qq" and queues["classic-q"].policy is None
    policies.set_policy("/", "cq", "-q$", {"max-length": 2}, apply_to="classic_queues")
    assert queues["quorum-q"].policy == "qq" and queues["classic-q"].policy == "cq"
    policies.set_policy("/", "all", "-q$", {"max-length": 3}, apply_to="queues", priority=5)
    assert queues["quorum-q"].policy == "all" and queues["classic-q"].policy == "all"
    # a quorum queue's delivery limit comes from the policy rather than the default 20
    policies.set_policy("/", "all", "-q$", {"delivery-limit": 7}, apply_to="queues", priority=5)
    assert queues["quorum-q"].opts.extra["x-delivery-limit"] == 7
    policies.clear_policy("/", "all")
    assert queues["quorum-q"].opts.extra["x-delivery-limit"] == 20
