"""A feature's internal queue, one per vhost (the scheduler's, transactions' held messages):
made on first use and added to its vhost, or made by recovery (which adds it itself). Does
not decide what the queue holds nor when it delivers (the feature's queue class does)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .queues.queue import Queue
    from .vhost import VirtualHost

Q = TypeVar("Q", bound="Queue")


class InternalQueues(dict[str, Q]):
    """vhost name -> the feature's queue there."""

    def __init__(self, make: Callable[[VirtualHost], Q]) -> None:
        super().__init__()
        self._make = make

    def new(self, vhost: VirtualHost) -> Q:
        """The queue for ``vhost``, not added to it (also the factory recovery uses)."""
        q = self[vhost.name] = self._make(vhost)
        return q

    def of(self, vhost: VirtualHost) -> Q:
        """The queue of ``vhost``, made and added to the vhost on first use."""
        q = self.get(vhost.name)
        if q is None:
            q = self.new(vhost)
            vhost.add_queue(q)
        return q
