"""The group commit of a broker's stream logs and their registry; not what a commit writes.

The group commit of a broker's stream logs (one trio task, the fsyncs in a worker thread)
and the registry of open logs by directory. Not what a commit writes (``log``).
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .log import StreamLog

Address = tuple[str, int]


class ReplicaDirectory(Protocol):
    """Where a cluster keeps copies of streams (``cluster/stream_replicas.py``), as the
    Stream protocol's readers and Metadata ask it."""

    def local_log(self, vhost: str, name: str) -> StreamLog | None:
        """This node's copy of a stream led by another node, while it is kept."""

    def placement(self, vhost: str, name: str,
                  here: Address) -> tuple[Address, list[Address]] | None:
        """The leader's and the other members' Stream-protocol addresses."""

log = logging.getLogger("triomq.streams")


def stream_dir(data_dir: str, vhost: str, name: str) -> str:
    """The directory of a stream: names are hex-encoded, so any vhost or queue name maps
    to one safe directory name."""
    return os.path.join(data_dir, "streams", vhost.encode("utf-8", "surrogateescape").hex(),
                        name.encode("utf-8", "surrogateescape").hex())


class StreamStore:
    """The group commit of every stream log of a broker: ``run`` (a task of the broker's
    nursery) commits the logs appended to since its last round, fsyncs in a worker
    thread, then confirms on the loop. Also the registry of open logs by directory."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.logs: dict[str, StreamLog] = {}
        self._dirty: dict[int, StreamLog] = {}
        self._wake: Any = None  # trio.Event while run() runs
        self.running = False
        # in a cluster (set by it when it installs): the streams' copies on other nodes; a
        # log opened waits for a replica before it confirms, until its replica group is
        # known (``StreamLog.set_replicas``)
        self.replicas: ReplicaDirectory | None = None

    def open(self, vhost: str, name: str, **settings) -> StreamLog:
        path = stream_dir(self.data_dir, vhost, name)
        lg = self.logs.get(path)
        if lg is None or lg.closed:
            from .log import StreamLog  # the log module imports this one
            lg = StreamLog(path, **settings)
            lg._store = self
            self.logs[path] = lg
            if self.replicas is not None:
                lg.set_replicas([], 2)
        return lg

    def forget(self, lg: StreamLog) -> None:
        self.logs.pop(lg.directory, None)
        self._dirty.pop(id(lg), None)
        lg._store = None

    def dirty(self, lg: StreamLog) -> None:
        self._dirty[id(lg)] = lg
        if self._wake is not None:
            self._wake.set()
        elif not self.running:
            lg.commit()  # no commit task (tools, tests): commit at once

    def commit_all(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for lg in dirty.values():
            lg.commit()

    async def run(self, task_status=None) -> None:
        import trio
        self.running = True
        self._wake = trio.Event()
        if task_status is not None:
            task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                dirty, self._dirty = self._dirty, {}
                states = []
                failed: list[StreamLog] = []
                for lg in dirty.values():
                    if lg.closed:
                        continue
                    try:
                        states.append((lg, lg.begin_commit()))
                    except OSError:
                        log.exception("stream %s: write failed; retrying in 1 s, its "
                                      "publishes stay unconfirmed meanwhile", lg.directory)
                        failed.append(lg)

                def sync(states=states, failed=failed):
                    done = []
                    for lg, state in states:
                        try:
                            lg.sync_files(state)
                        except OSError:
                            if not lg.closed:  # closed meanwhile (deleted): nothing to confirm
                                log.exception("stream %s: fsync failed; retrying in 1 s, its "
                                              "publishes stay unconfirmed meanwhile",
                                              lg.directory)
                                failed.append(lg)
                            continue
                        done.append((lg, state))
                    return done
                for lg, state in await trio.to_thread.run_sync(sync):
                    if not lg.closed:
                        lg.end_commit(state)
                if failed:
                    await trio.sleep(1)
                    for lg in failed:
                        if not lg.closed:
                            self.dirty(lg)
        finally:
            self._wake = None
            self.running = False
            try:
                self.commit_all()
            except OSError:
                log.exception("streams: the last commit at shutdown failed")
