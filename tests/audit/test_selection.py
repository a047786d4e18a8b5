"""Which queues the trail follows: broker-wide, or by the policy key ``audit``."""
from __future__ import annotations

from broker.audit import events
from broker.audit.spool import loads
from broker.broker import Broker
from broker.config import AuditSettings, Config

from ..support import make_message


def _broker(tmp_path, scope):
    return Broker(Config(data_dir=str(tmp_path),
                         audit=AuditSettings(dir=str(tmp_path / "trail"), scope=scope)))


def test_scope_all_follows_every_queue_but_policy_false(tmp_path):
    broker = _broker(tmp_path, "all")
    trail = broker.audit
    vhost = broker.vhosts["/"]
    broker.policies.set_policy("/", "quiet", "^noisy$", {"audit": False})
    loud = vhost.ensure_queue("orders", False, {})
    noisy = vhost.ensure_queue("noisy", False, {})
    assert trail in loud.observers and trail not in noisy.observers
    loud.enqueue(make_message(b"a"))
    noisy.enqueue(make_message(b"b"))
    assert [(ev[0], ev[3]) for ev in trail.events()] == [(events.ENQ, "orders")]


def test_scope_policy_follows_policy_changes(tmp_path):
    broker = _broker(tmp_path, "policy")
    trail = broker.audit
    vhost = broker.vhosts["/"]
    q = vhost.ensure_queue("payments", False, {})
    assert trail not in q.observers and not trail.vhost_audited("/")
    broker.policies.set_policy("/", "audited", "^pay", {"audit": True})
    assert trail in q.observers and trail.vhost_audited("/")
    q.enqueue(make_message(b"p"))
    assert len(trail.events()) == 1
    broker.policies.clear_policy("/", "audited")
    assert trail not in q.observers and not trail.vhost_audited("/")
    q.enqueue(make_message(b"p"))
    assert len(trail.events()) == 1


def test_drop_policy_counts_what_it_drops(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path), audit=AuditSettings(
        dir=str(tmp_path / "trail"), policy="drop", buffer_events=3)))
    trail = broker.audit
    q = broker.vhosts["/"].ensure_queue("q", False, {})
    for _ in range(5):
        q.enqueue(make_message(b"x"))
    assert len(trail.events()) == 3 and trail.dropped == 2
    frames, reports = trail._take_frames()
    assert reports == 1
    batch = [ev for _, _, data in frames for ev in loads(data)]
    assert batch[-1][:4] == (events.TRAIL, batch[-1][1], "audit_dropped", 2)
    assert not broker.alarms


def test_block_policy_raises_an_alarm(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path), audit=AuditSettings(
        dir=str(tmp_path / "trail"), buffer_events=3)))
    q = broker.vhosts["/"].ensure_queue("q", False, {})
    for _ in range(5):
        q.enqueue(make_message(b"x"))
    assert len(broker.audit.events()) == 5  # kept: up to twice the bound
    assert broker.alarms == {"audit trail"}
