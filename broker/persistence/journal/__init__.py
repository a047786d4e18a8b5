"""The embedded default store: an append-only journal of CRC-checked records (see
docs/durability.md), one module per job:

- ``store``: the ``JournalStore`` class (open, recovery into the broker, tasks, close),
  made of the mixins below;
- ``hooks``: the core's calls turned into records; ``writer``: the buffer, group-commit
  writes, confirms and a failed write's retry; ``reader``: messages read back by location;
- ``checkpoint``, ``compaction``: the two kinds of background rewrite;
- ``load`` and ``state``: what recovery reads (checkpoint + replayed log) and holds;
- ``stored``: unacked deliveries' messages kept by location; ``parked`` and ``parking``:
  deliveries a channel holds for long kept as rows; ``common``: shared constants.

This package only re-exports what the rest of the code imports.
"""
from .common import ENQ_MIN, NAN
from .load import load_checkpoint, load_state
from .state import JournalState, QueueState, _count_live
from .store import JournalStore
from .stored import _SLOTS, StoredMessage

__all__ = ["ENQ_MIN", "NAN", "_SLOTS", "JournalState", "JournalStore", "QueueState", "StoredMessage",
           "_count_live", "load_checkpoint", "load_state"]
