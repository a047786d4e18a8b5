"""A forwarded publish's answer reaches the publish it belongs to. A publish refused
before anything was sent (the link to the queue's master failing: nacked at once) never
reaches the store's ``when_durable``; its bookkeeping must not be taken over by the next
publish, of another channel: when that one's forward was then lost in doubt (the link
dropped before the master answered, the master having enqueued it), its publisher was
nacked -- the answer went by the first publisher's closed channel -- and the message was
delivered anyway (the fault harness, aio-pika, restart-etcd)."""
from __future__ import annotations

from broker.cluster.etcd import EtcdGateway
from broker.cluster.node import ClusterNode
from broker.cluster.settings import build_settings
from broker.cluster.store import ClusterStore
from broker.persistence.base import MemoryStore


class _Session:
    def __init__(self) -> None:
        self.closed_with: list = []

    def force_close(self, error) -> None:
        self.closed_with.append(error)


class _Channel:
    def __init__(self) -> None:
        self.closed = False
        self.session = _Session()


def _store() -> ClusterStore:
    settings = build_settings("etcd://127.0.0.1:1/t", "n1", None, "127.0.0.1", 5672, None, 2.0)
    coord = EtcdGateway(settings.endpoints, settings.etcd_timeout)
    return ClusterStore(MemoryStore(), coord, ClusterNode(coord, settings))


def test_forward_in_doubt_after_a_refused_publish_of_another_channel_is_not_nacked():
    store = _store()
    first, second = _Channel(), _Channel()
    # the first channel's publish: its forward could not be sent (nacked at once)
    store.publishing = first
    store.forward_abandoned(store.forward_started())
    first.closed = True  # that publisher went away
    # the second channel's publish is forwarded, then the link drops before the answer
    store.publishing = second
    done = store.forward_started()
    answers: list[str] = []
    store.when_durable(lambda: answers.append("ack"), lambda: answers.append("nack"))
    done(None)
    assert answers == []  # in doubt: neither a confirm nor a nack ...
    assert len(second.session.closed_with) == 1  # ... its connection is closed (541)
    assert "in doubt" in str(second.session.closed_with[0])


def test_forwards_of_one_channel_still_add_up():
    """A tx.commit routes several publishes of one channel before one ``when_durable``:
    its commit-ok waits for every forward."""
    store = _store()
    channel = _Channel()
    store.publishing = channel
    first = store.forward_started()
    second = store.forward_started()
    answers: list[str] = []
    store.when_durable(lambda: answers.append("ack"), lambda: answers.append("nack"))
    first(True)
    assert answers == []
    second(True)
    assert answers == ["ack"]
