"""The audit trail: every audited message's lifecycle as Avro files (docs/audit.md).

``events`` (event tuples -> records, the schema file), ``recorder`` (the broker's hooks,
queue observer and drain task), ``writer`` (the process that encodes and rolls files),
``reader`` (the tolerant reader the Spark jobs and the writer share). Importing this
package does not import trio or the broker core, so the Spark jobs can ship it alone.
"""
from __future__ import annotations


def install(broker):
    """Turn the trail on if ``--audit-dir`` is set; returns the ``AuditTrail`` or None."""
    from .recorder import install as _install
    return _install(broker)


def note_retry(queue, entry, delay_ms: int) -> None:
    """``queues/retry.py``: ``entry`` of ``queue`` is retried after ``delay_ms`` (0: now).

    The trail, when it follows ``queue``, is one of its observers; nothing to do otherwise.
    """
    from .recorder import AuditTrail
    for observer in queue.observers:
        if isinstance(observer, AuditTrail):
            observer.retried(queue, entry, delay_ms)
