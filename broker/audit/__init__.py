"""The audit trail: every audited message's lifecycle as Avro files (docs/audit.md).

``events`` (event tuples -> records, the schema file), ``hooks`` (the per-message hooks,
in Python and, compiled, ``_hooks.c``), ``recorder`` (the rest of the broker's side: the
queue observer and the drain task), ``writer`` (the process that encodes and rolls files),
``reader`` (the tolerant reader the Spark jobs and the writer share). Importing this
package does not import trio or the broker core, so the Spark jobs can ship it alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import AuditServices


def install(broker: Broker, services: AuditServices):
    """Turn the trail on if ``--audit-dir`` is set; returns the ``AuditTrail`` or None."""
    if not broker.config.audit.dir:
        return None  # the trail's modules (hooks, Avro events) are imported only when it is on
    from .recorder import install as _install
    return _install(broker, services)
