"""Policies survive a restart on every durable store (through Store.save_meta), come
back before the queues they apply to are used, and a cleared policy stays cleared."""
from __future__ import annotations

import pytest

from ..persistence.test_sql_store import _make_db
from ..support import broker_life, make_message


def _lives(url, data_dir):
    seen = {}

    def first(vhost):
        pol = vhost.policies
        q = vhost.declare_queue("q", None, durable=True)
        for i in range(5):
            q.enqueue(make_message(b"%d" % i, routing_key="q", delivery_mode=2))
        pol.set_policy("/", "p", "^q$", {"max-length": 3, "ha-mode": "exactly", "ha-params": 2},
                       priority=1, apply_to="queues")
        pol.set_operator_policy("/", "o", "^q", {"message-ttl": 60000})
        pol.set_policy("/", "gone", ".*", {"max-length": 1})
        pol.clear_policy("/", "gone")
        assert q.message_count == 3
        vhost.declare_exchange("x", "direct", durable=True)
        pol.set_policy("/", "ae", "^x$", {"alternate-exchange": "ae"}, apply_to="exchanges")

    def second(vhost):
        pol = vhost.policies
        q = vhost.queues["q"]
        seen["policies"] = pol.list_policies()
        seen["operator"] = pol.list_operator_policies()
        seen["queue"] = (q.policy, q.operator_policy, q.effective_policy_definition,
                         q.message_count)
        for i in range(5):
            q.enqueue(make_message(b"n%d" % i, routing_key="q", delivery_mode=2))
        seen["after"] = q.message_count
        x = vhost.exchanges["x"]
        seen["exchange"] = (x.policy, x.alternate_exchange)
        pol.clear_operator_policy("/", "o")

    def third(vhost):
        seen["third"] = vhost.policies.list_operator_policies()

    broker_life(url, data_dir, first)
    broker_life(url, data_dir, second)
    broker_life(url, data_dir, third)
    assert seen["policies"][0]["name"] == "ae"
    assert seen["policies"][1:] == [{"vhost": "/", "name": "p", "pattern": "^q$", "apply-to": "queues",
                                 "definition": {"max-length": 3, "ha-mode": "exactly",
                                                "ha-params": 2}, "priority": 1}]
    assert [p["name"] for p in seen["operator"]] == ["o"]
    assert seen["queue"] == ("p", "o", {"max-length": 3, "ha-mode": "exactly", "ha-params": 2,
                                        "message-ttl": 60000}, 3)
    assert seen["after"] == 3
    assert seen["exchange"] == ("ae", "ae")  # recreated by the store, then given its policy
    assert seen["third"] == []


def test_policies_survive_restarts_in_the_journal(tmp_path):
    _lives("journal", tmp_path)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_policies_survive_restarts_in_sql(kind, tmp_path):
    db = _make_db(kind)
    try:
        _lives(db.url, tmp_path)
    finally:
        db.drop()
