"""A stream's leader leaves its replica group, and a deposed leader keeps its copy.

* **Removing the leader** (``delete_replica`` of the leader, ``stream_members.py``): the
  group record in etcd names the other members only, the leader unchanged. The leader sees
  it in its round (``StreamReplicas._lead``) and steps down (``step_down``): it waits until
  everything appended to its log is confirmed (a majority of the old group has it: each
  publisher gets its confirm), then, at once, its stream queue becomes a proxy (its AMQP
  consumers are cancelled, Stream-protocol clients get a MetadataUpdate and look the
  leader up again) and its copy is deleted; then it gives up its master key (fenced: only
  the key of the epoch it holds). The remaining members elect a leader by the usual rule
  (``StreamReplicas._elect``: a majority of the new group posts its tails, the latest
  label then the longest log wins): every confirmed chunk is on a majority of the old
  group, so on at least one of any majority of the others. The new leader's definition
  retargets the proxies, the old leader's too. Publishes that reach the old leader's
  proxy before then are forwarded (to the first other member, which forwards on until
  the new leader is known) or nacked, as in a failover.
* **A deposed leader** (its stream mastered by another node when it comes back, after a
  kill or a partition: ``ClusterStore._drop_superseded``) keeps its log files
  (``keeping_copy``): its follower then cuts the copy back by the rule of
  ``stream_divergence.py`` (its label is the epoch it led: ``StreamReplicas._promote``
  writes it) and copies only what it lacks, as osiris.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio

from ..queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .stream_replicas import StreamReplicas

log = logging.getLogger("broker.cluster.streams")

DRAIN_S = 10.0  # how long a step-down waits for its log's confirms in one round
KEPT = ".kept"


async def step_down(replicas: StreamReplicas, vhost: VirtualHost, q: StreamQueue, group: dict) -> bool:
    """This node leads ``q`` but its group record no longer names it: hand the stream to
    the other members (see the module docstring). False when its log's confirms did not
    all come in this round (tried again next round)."""
    lg = q.log
    with trio.move_on_after(DRAIN_S):
        while lg.durable_offset < lg.next_offset - 1:
            done = trio.Event()
            lg.when_durable(lg.next_offset - 1, done.set)
            await done.wait()
    # no await from here until the queue is a proxy: nothing appended that is not confirmed
    if q.deleted or vhost.queues.get(q.name) is not q \
            or lg.durable_offset < lg.next_offset - 1:
        return False
    store, node = replicas.store, replicas.store.node
    successor = sorted(m for m in group.get("members", []) if m != node.name)[0]
    bindings = bindings_of(vhost, q)
    store._applying = True  # local only: the stream itself is not deleted
    try:
        vhost.delete_queue(q, reason="stream leader removed from its replica group")
    finally:
        store._applying = False
    proxy = store._add_proxy(vhost, q.name, successor, q.auto_delete, dict(q.arguments))
    rebind(vhost, proxy, bindings, persist=False)  # the proxy routes as the queue did
    await node.release_master(vhost.name, q.name)
    log.warning("stream %r in vhost %r: removed from its replica group, this node steps "
                "down as its leader (log up to offset %d confirmed; copy deleted); "
                "members %s elect the next", q.name, vhost.name, lg.committed_offset,
                ", ".join(group.get("members", [])))
    return True


def bindings_of(vhost: VirtualHost, q) -> list[tuple[str, str, dict]]:
    """(source, routing key, arguments) of the bindings to ``q``: the queue that replaces
    it under its name (a proxy, or the promoted leader) takes them on (``rebind``); the
    vhost drops them with the queue, and etcd's records of them do not change."""
    out = []
    for source, key in list(q.bindings):
        x = vhost.exchanges.get(source)
        b = x.bindings.get(key) if x is not None else None
        if b is not None:
            out.append((source, b.routing_key, b.arguments))
    return out


def rebind(vhost: VirtualHost, q, bindings: list[tuple[str, str, dict]], persist: bool) -> None:
    for source, routing_key, arguments in bindings:
        if source in vhost.exchanges:
            vhost.bind(source, q, routing_key, arguments, persist=persist)


@contextlib.contextmanager
def keeping_copy(q) -> Iterator[None]:
    """Around the deletion of a deposed leader's stream queue: its log files stay (linked
    aside, then back) for its follower to cut back and complete (stream_divergence.py)."""
    if not isinstance(q, StreamQueue) or q.log.closed:
        yield
        return
    lg = q.log
    lg.close()  # what was appended is written first
    directory = lg.directory
    aside = directory + KEPT
    _remove(aside)
    os.mkdir(aside)
    for name in os.listdir(directory):
        os.link(os.path.join(directory, name), os.path.join(aside, name))
    try:
        yield
    finally:
        if os.path.isdir(directory):
            _remove(aside)  # not deleted after all
        else:
            os.rename(aside, directory)


def restore_kept(directory: str) -> None:
    """A stop between the deletion and the link back (``keeping_copy``) left the files
    aside: they are the copy again."""
    aside = directory + KEPT
    if os.path.isdir(aside):
        if os.path.isdir(directory):
            _remove(aside)
        else:
            os.rename(aside, directory)


def _remove(directory: str) -> None:
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
