# The C hooks (_hooks.c): the same interface as hooks.PyHooks.
from typing import Any

LAYOUT: tuple[int, int, int, int, int]

class Hooks:
    buf: list[Any]
    base: int
    limit: int
    now: float
    _scope_all: bool
    _vhosts_on: dict[str, int]
    dropped_total: int
    def clock_start(self) -> None: ...
    def clock_stop(self) -> None: ...
    def published(self, channel: Any, message: Any, queues: Any, outcome: str,
                  seq: Any) -> None: ...
    def delivered(self, channel: Any, ctag: Any, tag: int, queue: Any, entry: Any) -> int: ...
    def acked(self, channel: Any, item: Any) -> None: ...
