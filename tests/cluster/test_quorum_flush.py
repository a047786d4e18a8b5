"""A quorum queue leader's flush never loses a confirm token: a follower in sync when a
publish took its token, then failed and started its catch-up probe before the ops were
flushed, got no op (a probing member gets none: its catch-up starts from a snapshot) and
its token was dropped -- that publish was never answered (no confirm, nack or 541) and the
queue's commit index stopped at it, so consumers never saw a message after it.

White-box on the real objects (a cluster store, a vhost's quorum queue, the master side's
``Mirroring``) without etcd or other nodes: what is checked is the bookkeeping of one
flush, which the processes' timing makes a race."""
from __future__ import annotations

import trio

from broker.cluster.etcd import EtcdGateway
from broker.cluster.mirror import Mirrors
from broker.cluster.mirror_master import Mirroring
from broker.cluster.node import ClusterNode
from broker.cluster.settings import build_settings
from broker.cluster.store import ClusterStore
from broker.message import Message
from broker.persistence.base import MemoryStore


class _Session:
    def __init__(self) -> None:
        self.closed_with: list = []

    def force_close(self, error) -> None:
        self.closed_with.append(error)


class _Channel:
    """What the cluster store's forward bookkeeping asks of the publishing channel."""

    def __init__(self) -> None:
        self.closed = False
        self.session = _Session()


def _leader(broker) -> tuple[ClusterStore, Mirroring]:
    settings = build_settings("etcd://127.0.0.1:1/t", "a", None, "127.0.0.1", 5672, None, 2.0)
    coord = EtcdGateway(settings.endpoints, settings.etcd_timeout)
    store = ClusterStore(MemoryStore(), coord, ClusterNode(coord, settings))
    store.broker = broker
    store._addresses = {"b": "127.0.0.1:1", "c": "127.0.0.1:1"}
    q = broker.vhosts["/"].declare_queue("qq", durable=True, arguments={"x-queue-type": "quorum"})
    m = Mirroring(Mirrors(store), q, epoch=7)
    q.observers.append(m)
    m.members = ["a", "b", "c"]
    m.nodes.update({"b": "in_sync", "c": "in_sync"})
    m.isr_dirty = False
    q.confirms_later = True
    return store, m


async def test_a_follower_turned_probing_before_the_flush_keeps_its_confirm_token(broker):
    store, m = _leader(broker)
    channel = _Channel()
    answers: list[str] = []
    store.publishing = channel
    m.queue.enqueue(Message("", "qq", b"", {}, b"body"))
    store.when_durable(lambda: answers.append("ack"), lambda: answers.append("nack"))
    async with trio.open_nursery() as nursery:
        store._nursery = nursery
        # before the flush: b's op is refused, b fails, and the reconcile starts its
        # catch-up, which first asks b what it has (probing: it gets no op meanwhile)
        m.mirror_failed("b")
        m.start_sync("b")
        assert m.nodes["b"] == "probing"
        m.flush()
        # c takes the batch (its link holds it until the first connection)
        link_c = store.link_for("c", "/")
        for item in link_c._held:
            item[5](True)
        assert answers == []  # b's confirm waits for the smaller in-sync record ...
        # ... and is answered when the mastership ends (in doubt: the connection is closed)
        m.detach()
        nursery.cancel_scope.cancel()
    assert answers or channel.session.closed_with, \
        "the publish was never answered: b's confirm token was dropped by the flush"


def _publish(store, m, body: bytes, answers: list) -> None:
    store.publishing = _Channel()
    m.queue.enqueue(Message("", "qq", b"", {}, body))
    store.when_durable(lambda: answers.append(body), lambda: answers.append(b"nack"))


def _answer(store, node: str, ok=True) -> None:
    link = store.link_for(node, "/")
    held, link._held = link._held, []
    for item in held:
        item[5](ok)


async def test_one_flush_is_confirmed_once_every_in_sync_member_answered(broker):
    """The messages of one flush share their members' answers: none is confirmed (nor
    given to consumers: the commit index) before every in-sync member took the op."""
    store, m = _leader(broker)
    answers: list[bytes] = []
    _publish(store, m, b"one", answers)
    _publish(store, m, b"two", answers)
    m.flush()
    _answer(store, "b")
    assert answers == [] and m.queue.commit_seq == 0
    _answer(store, "c")
    assert answers == [b"one", b"two"] and m.queue.commit_seq == 2


async def test_a_member_in_sync_during_a_pass_is_owed_the_later_messages(broker):
    """A member that joins the in-sync set between two publishes of one pass: the later
    message waits for it as well (the record may name it: it must hold what is confirmed)."""
    store, m = _leader(broker)
    m.nodes["c"] = "syncing"
    answers: list[bytes] = []
    _publish(store, m, b"before", answers)
    m.nodes["c"] = "in_sync"
    _publish(store, m, b"after", answers)
    m.flush()
    _answer(store, "b")
    assert answers == [b"before"]
    _answer(store, "c")
    assert answers == [b"before", b"after"] and m.queue.commit_seq == 2
