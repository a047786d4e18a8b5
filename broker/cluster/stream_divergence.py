"""A stream copy that diverged from its group's log is cut back before it copies again,
as osiris truncates a replica to the last chunk it shares with the leader.

With five members or more a copy can hold chunks no later leader has: it received chunks
of an old leader that never reached a majority, and the group went on without it (the old
leader and this copy down, a new leader elected by the others). Those chunks were never
confirmed; offsets past them are reused by the new leader for other chunks.

* **History.** Each leader promoted by a failover appends ``[epoch, start]`` to the group
  record (``streams/VHOST/QUEUE`` in etcd, ``history``): its master key's epoch and its
  log's tail when it took over. Up to ``start`` its log is its predecessor's (it copied
  it); from ``start`` on it writes its own. The record also names the current ``epoch``
  (0: the stream's first leader, which has no entry).
* **Label.** Each copy keeps, in its log directory (``replica-epoch``, written durably),
  the epoch of the last leader whose log it holds up to that leader's ``start``: it is
  then a prefix of that leader's log. The label moves to the current leader's epoch once
  the copy has committed up to its ``start`` (so a copy cut short and not yet caught up
  keeps its old label, as Raft's last entry term).
* **Cut.** Before copying from a leader, a copy labelled ``L`` cuts its log at the least
  ``start`` of every leader after ``L`` (``truncation_point``): up to there every later
  leader's log is the one it copied; past it any of them may hold other chunks.
* **Election.** The members that post their tails for an election post their label too;
  the highest label wins, then the longest log (``stream_replicas._elect``), so a copy
  with stale chunks (an old label) does not win over members that hold what a later
  leader confirmed.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from ..streams.segment import FILE_HEADER, INDEX_ENTRY, fsync_dir, replace_file

log = logging.getLogger("broker.cluster.streams")

LABEL_FILE = "replica-epoch"


def truncation_point(tail: int, label: int | None, history: Iterable) -> int:
    """Where a copy whose log ends at ``tail`` (its next offset), labelled ``label`` (None:
    unknown, every leader counts), must be cut before it copies from the current leader
    of a group with this ``history`` ([epoch, start] pairs)."""
    cut = tail
    for epoch, start in history:
        if label is None or epoch > label:
            cut = min(cut, start)
    return cut


def leader_start(history: Iterable, epoch: int) -> int | None:
    """The offset from which the leader of ``epoch`` wrote its own chunks (0 for the first
    leader, epoch 0); None when the history does not name it yet."""
    if epoch == 0:
        return 0
    for e, start in history:
        if e == epoch:
            return start
    return None


def read_label(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, LABEL_FILE)) as f:
            return int(json.load(f)["epoch"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def write_label(directory: str, epoch: int) -> None:
    replace_file(directory, LABEL_FILE, json.dumps({"epoch": epoch}).encode())


def truncate_log_files(directory: str, offset: int) -> bool:
    """Cut the (closed, recovered) stream log in ``directory`` so that it ends before
    ``offset``: whole chunks only (a chunk holding ``offset`` goes too). True when no
    chunk is left (the caller restarts the log at ``offset``)."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".segment"))
    segments = [(int(n[:-len(".segment")]), os.path.join(directory, n)) for n in names]
    left = len(segments)
    for first, path in reversed(segments):
        index = path[:-len(".segment")] + ".index"
        if first >= offset:
            for p in (path, index):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            left -= 1
            continue
        with open(index, "rb") as f:
            data = f.read()
        n = (len(data) - FILE_HEADER) // INDEX_ENTRY.size
        for i in range(n):
            chunk_first, _ts, pos, records = INDEX_ENTRY.unpack_from(
                data, FILE_HEADER + i * INDEX_ENTRY.size)
            if chunk_first + records > offset:
                for p, size in ((path, pos), (index, FILE_HEADER + i * INDEX_ENTRY.size)):
                    fd = os.open(p, os.O_RDWR)
                    try:
                        os.ftruncate(fd, size)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                break
        break
    fsync_dir(directory)
    return left == 0
