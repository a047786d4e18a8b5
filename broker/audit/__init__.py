"""The audit trail: every audited message's lifecycle as Avro files (docs/audit.md).

``events`` (event tuples -> records, the schema file), ``hooks`` (the per-message hooks,
in Python and, compiled, ``_hooks.c``), ``recorder`` (the rest of the broker's side: the
queue observer and the drain task), ``writer`` (the process that encodes and rolls files),
``reader`` (the tolerant reader the Spark jobs and the writer share). Importing this
package does not import trio or the broker core, so the Spark jobs can ship it alone.
"""
from __future__ import annotations


def install(broker):
    """Turn the trail on if ``--audit-dir`` is set; returns the ``AuditTrail`` or None."""
    from .recorder import install as _install
    return _install(broker)


class Origin:
    """Who published a message that came without a channel (an HTTP publish: Hermes or the
    management API), in the shape the trail's ``published`` reads from a channel."""

    __slots__ = ("audit_ctx",)

    def __init__(self, vhost: str, user: str | None, peer: str | None):
        self.audit_ctx = (vhost, user, peer, None)


def note_retry(queue, entry, delay_ms: int) -> None:
    """``queues/retry.py``: ``entry`` of ``queue`` is retried after ``delay_ms`` (0: now).

    The trail, when it follows ``queue``, is one of its observers; nothing to do otherwise.
    """
    from .recorder import AuditTrail
    for observer in queue.observers:
        if isinstance(observer, AuditTrail):
            observer.retried(queue, entry, delay_ms)
