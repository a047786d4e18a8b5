"""A definition change is answered once every live node has applied it (docs/cluster.md,
"Definitions everywhere before the answer").

The change's ``when_durable`` (a declare-ok, the management API's 201/204) waits for two
things: this node's etcd write of it (its revision), then every other live node's
``applied/<node>`` key at that revision or later. A node writes its ``applied`` key after
its watch applied a batch holding other nodes' definitions, so a client whose next
connection lands on another node finds there what it was told exists. A node whose lease
ends meanwhile is no longer waited for; past ``timeout`` the answer goes with a warning.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import trio

log = logging.getLogger("broker.cluster")


class _Waiter:
    __slots__ = ("callback", "deadline", "gen", "target")

    def __init__(self, gen: int, deadline: float, callback: Callable[[], None]):
        self.gen = gen
        self.target = 0  # the etcd revision every live node must have applied (0: unknown)
        self.deadline = deadline
        self.callback = callback


class DefinitionSync:
    def __init__(self, me: str, live: Callable[[], set[str]], timeout: float):
        self.me = me
        self._live = live
        self.timeout = timeout
        self.gen = 0  # definition writes queued for etcd by this node
        self._claimed = 0  # the writes a when_durable already waits for
        self._flushed_gen = 0  # the writes etcd has
        self._written_rev = 0  # the revision of this node's latest definition write
        self.peers: dict[str, int] = {}  # node -> the revision its watch has applied
        self._waiters: list[_Waiter] = []
        self._wake = trio.Event()

    def wrote(self) -> None:
        self.gen += 1

    def claim(self) -> int:
        """The definition writes the next answer must wait for (0: none since the last)."""
        if self.gen <= self._claimed:
            return 0
        self._claimed = self.gen
        return self.gen

    def then(self, gen: int, callback: Callable[[], None]) -> Callable[[], None]:
        """``callback`` to be called once the writes up to ``gen`` are applied everywhere."""
        def durable() -> None:
            self._waiters.append(_Waiter(gen, trio.current_time() + self.timeout, callback))
            self.check()
            self._wake.set()  # the timer's deadline
        return durable

    def flushed(self, gen: int, revision: int) -> None:
        self._flushed_gen = max(self._flushed_gen, gen)
        self._written_rev = max(self._written_rev, revision)
        self.check()

    def peer_applied(self, node: str, revision: int) -> None:
        if revision > self.peers.get(node, 0):
            self.peers[node] = revision
            self.check()

    def check(self) -> None:
        if not self._waiters:
            return
        now = trio.current_time()
        peers = self._live() - {self.me}
        waiting, pending, self._waiters = [], self._waiters, []
        for w in pending:  # (a callback may add waiters meanwhile)
            if not w.target and self._flushed_gen >= w.gen:
                w.target = self._written_rev
            if w.target:
                behind = sorted(n for n in peers if self.peers.get(n, 0) < w.target)
            else:
                behind = ["etcd"]
            if not behind:
                w.callback()
            elif now >= w.deadline:
                log.warning("cluster: a definition change is answered after %.0f s without "
                            "%s having applied it (revision %s)", self.timeout,
                            ", ".join(behind), w.target or "not yet written")
                w.callback()
            else:
                waiting.append(w)
        self._waiters = waiting + self._waiters

    async def run(self) -> None:
        """Answers what waited past its deadline."""
        while True:
            deadline = min((w.deadline for w in self._waiters), default=float("inf"))
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            self.check()
