"""Faults injected into the serving broker. Each returns when the fault is in place; the
runner then waits for another broker to serve and heals the cluster afterwards."""
from __future__ import annotations

import threading

from .nodes import Node


class Kill9:
    """kill -9 the master: its lease stays in the database until it runs out (or, on the
    same host, until a standby sees its process is gone)."""
    name = "kill9"

    def inject(self, master: Node) -> None:
        master.kill9()

    def end(self, master: Node) -> None:
        pass


class Pause:
    """SIGSTOP the master for ``seconds``, then SIGCONT: a standby takes the lease over
    meanwhile, and the old master must find itself deposed and never confirm again."""
    name = "sigstop"

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def inject(self, master: Node) -> None:
        master.pause()
        self._timer = threading.Timer(self.seconds, master.resume)
        self._timer.daemon = True
        self._timer.start()

    def end(self, master: Node) -> None:
        if self._timer is not None:
            self._timer.join()


NEMESES = {"kill9": lambda pause: Kill9(), "sigstop": lambda pause: Pause(pause)}
