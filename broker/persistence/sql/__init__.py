"""JDBC-style store on SQLAlchemy 2 (SQLite, PostgreSQL, MariaDB/MySQL), one module per job:

- ``store``: the ``SQLStore`` class (engines, open/close, its tasks), made of the mixins below;
- ``hooks``: the core's calls, buffered into a batch (trio thread, no database);
- ``commit``: the writer task: batches committed in order, confirms, outages;
- ``batch``: a batch's transaction in the worker thread;
- ``lease``: the lease (ACTIVEMQ_LOCK) and the tasks that renew it and fence the broker;
- ``index``: the entry index (totals, ranges of seqs); ``loader``: what start-up reads restored
  into the broker, then the rest of each index read while it serves;
- ``paging``: the pager of durable FIFO backlogs; ``report``: ``broker inspect --store``.

This package only re-exports what the rest of the code imports. See docs/sql-store.md.
"""
from .common import StoreDeposed, StoreLocked
from .index import _QueueIndex
from .report import inspect
from .store import SQLStore

__all__ = ["SQLStore", "StoreDeposed", "StoreLocked", "_QueueIndex", "inspect"]
