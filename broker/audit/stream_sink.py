"""The audit trail into a stream (``--audit-stream NAME``), besides the Avro files.

The drain task hands each batch of frames it spooled to ``StreamSink.send``: a worker
thread turns the events into their Avro records as JSON lines (the same fields, ``seq``
included, as ``events.to_record``), at most ``MESSAGE_EVENTS`` events per message so a
message stays far below the Stream protocol's 1 MiB frame; the event loop then publishes
them through the broker's publish path into the stream of vhost ``/`` (declared when
missing). The messages carry headers ``x-audit-node``, ``x-audit-first-seq`` and
``x-audit-count``. The stream itself is never audited and these publishes are not
recorded (no user published them), so the trail does not feed on itself.

JSON, not the spool's marshal/pickle frames: a stream has readers the broker does not
control, and pickle from a stream would run code in them.

Delivery into the stream is at most once: a broker killed between spooling a batch and
publishing it leaves those sequence numbers out of the stream (the Avro files have them;
``spark.audit reconcile --follow`` reports the gap as the trail's integrity check does).
"""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from ..amqp.fields import encode_properties
from ..message import Message
from . import events
from .spool import loads

if TYPE_CHECKING:
    from ..services import AuditServices

log = logging.getLogger("triomq.audit")

MESSAGE_EVENTS = 256
VHOST = "/"


def bodies(frames: list[tuple[int, int, bytes]], node: str) -> list[tuple[int, int, bytes]]:
    """``(first seq, events, JSON lines)`` for the messages of spooled ``frames``."""
    out = []
    for first, _count, data in frames:
        batch = loads(data)
        for i in range(0, len(batch), MESSAGE_EVENTS):
            part = batch[i:i + MESSAGE_EVENTS]
            lines = [json.dumps(events.to_record(ev, node, first + i + j), default=str,
                                separators=(",", ":"))
                     for j, ev in enumerate(part)]
            out.append((first + i, len(part), ("\n".join(lines) + "\n").encode()))
    return out


class StreamSink:
    def __init__(self, services: AuditServices, name: str, node: str) -> None:
        self.services = services  # the composition root's, never the whole broker
        self.name = name
        self.node = node
        self._failed = False

    def is_sink(self, q) -> bool:
        return q.name == self.name and q.vhost.name == VHOST

    def _vhost(self):
        """The vhost of the stream, which is declared if missing."""
        vhost = self.services.vhosts.get(VHOST)
        if vhost is None:
            return None
        if vhost.find_queue(self.name) is None:
            vhost.declare_queue(self.name, durable=True, arguments={"x-queue-type": "stream"})
        return vhost

    def publish(self, messages: list[tuple[int, int, bytes]]) -> None:
        """Publish what ``bodies`` made (on the event loop)."""
        from ..publishing import ROUTED, STORING, Source
        try:
            vhost = self._vhost()
        except Exception as exc:  # e.g. a classic queue of that name: the files still work
            if not self._failed:
                log.error("audit stream %r: cannot declare it (%s); events go to the "
                          "files only", self.name, exc)
            self._failed = True
            return
        if vhost is None:
            return
        source = Source(vhost, None, "audit")
        for first, count, body in messages:
            props = {"content_type": "application/x-ndjson", "delivery_mode": 2,
                     "headers": {"x-audit-node": self.node, "x-audit-first-seq": first,
                                 "x-audit-count": count}}
            message = Message("", self.name, encode_properties(props), props, body)
            outcome = self.services.publishing.publish(source, message, audited=False)
            stored = outcome in (ROUTED, STORING)
            if not stored and not self._failed:
                log.error("audit stream %r: events %d-%d not stored (%s)", self.name,
                          first, first + count - 1, outcome)
                self._failed = True
            elif stored:
                self._failed = False
