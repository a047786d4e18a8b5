"""A mirror's copy of a queue on disk, so a mirror that restarts catches up from its own copy
instead of from nothing (``mirror.py``: the master asks the returning mirror what it has,
then sends only what it lacks).

One append-only file per copy, beside the node's store (``Store.sidecar_path``): records
``[kind: 1 byte][length: 4 bytes][payload]``, written and flushed before the op is
confirmed to the master (so a kill -9 of the mirror keeps them: the OS has them); a quorum
queue member's copy (``durable``) is fsynced too before the confirm (``mirror_copy.MirrorCopies.syncer``:
one fsync for every op that arrived meanwhile), since its confirm counts towards the
majority that makes a publish confirmed (a power loss must not take it back).

* ``R`` a new copy: JSON {vhost, queue, epoch, master}; the file starts with it
* ``E`` messages that entered (``mirror_ops.pack_entries``)
* ``L`` seqs that left (``mirror_ops.pack_seqs``)
* ``S`` the copy is complete (synced)
* ``C`` delivery counts of entries that came back (``mirror_ops.pack_counts``: a quorum
  queue's x-delivery-count and delivery limit survive a failover)

A torn record at the end (a crash while writing) ends the replay and is cut off. When the
file grows past four times what the copy holds (and 16 MiB), it is rewritten from the copy.
"""
from __future__ import annotations

import json
import logging
import os
import struct
from hashlib import sha256

log = logging.getLogger("broker.cluster.copylog")

_HEAD = struct.Struct(">cI")
_COMPACT_MIN = 16 << 20


def copy_path(directory: str, vhost: str, queue: str) -> str:
    digest = sha256(f"{vhost}\0{queue}".encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(directory, f"{digest}.copy")


class CopyLog:
    """The file of one copy; ``size`` bytes written, ``live`` an estimate of the copy."""

    def __init__(self, path: str, size: int = 0, durable: bool = False):
        self.path = path
        self.size = size
        self.live = 0
        self.durable = durable
        self._f = open(path, "r+b" if size else "wb")  # noqa: SIM115  (kept open)
        if size:
            self._f.seek(size)
            self._f.truncate()

    @classmethod
    def create(cls, path: str, header: dict, durable: bool = False) -> CopyLog:
        log_ = cls(path, durable=durable)
        log_.append(b"R", json.dumps(header).encode())
        return log_

    def append(self, kind: bytes, payload: bytes) -> None:
        self._f.write(_HEAD.pack(kind, len(payload)))
        self._f.write(payload)
        self._f.flush()
        self.size += _HEAD.size + len(payload)

    @property
    def closed(self) -> bool:
        return self._f.closed

    def dup(self) -> int:
        """A descriptor of the file for an fsync elsewhere (the caller closes it)."""
        return os.dup(self._f.fileno())

    def sync(self) -> None:
        os.fsync(self._f.fileno())

    def wants_compaction(self) -> bool:
        return self.size > _COMPACT_MIN and self.size > 4 * self.live

    def close(self) -> None:
        self._f.close()

    def remove(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def replay(path: str):
    """(header, [(kind, payload)], valid length) of the file; None if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    pos = 0
    records = []
    while pos + _HEAD.size <= len(data):
        kind, n = _HEAD.unpack_from(data, pos)
        if pos + _HEAD.size + n > len(data):
            break  # torn at the end
        records.append((kind, data[pos + _HEAD.size:pos + _HEAD.size + n]))
        pos += _HEAD.size + n
    if not records or records[0][0] != b"R":
        return None
    try:
        header = json.loads(records[0][1])
    except ValueError:
        return None
    return header, records[1:], pos
