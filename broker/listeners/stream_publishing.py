"""Stream-protocol publishing (publishers, dedup, batches, confirms); not consuming.

Publishing over the Stream protocol: publishers, deduplication by reference, messages and
sub-entry batches into the stream's log, confirms after the commit, the audit trail's
records of them. Not consuming (``stream_consuming``) or the connection (``stream_session``).
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ..message import Message
from ..publishing import NACKED
from ..queues.stream import StreamQueue
from ..streamproto import codec
from ..streams import record as records
from .stream_core import StreamSessionCore

log = logging.getLogger("broker.stream")

# the log's named-offsets table holds publishers' sequences under this prefix (a name no
# consumer reference is expected to start with)
PUBLISHER_KEY = "\x00publisher:"
MAX_REFERENCE = 256
MAX_CHUNK_ENTRIES = 0xFFFF  # a chunk's entry count is a u16
RUN_BYTES = 1 << 20  # sub-entries joined into one chunk up to this size


@dataclass(slots=True, eq=False)
class Publisher:
    id: int
    stream: str
    queue: StreamQueue
    reference: str | None
    sequence: int  # the last publishing id written (dedup), -1: none


class StreamPublishing(StreamSessionCore):
    """The publishing commands of a ``StreamSession``."""

    def _declare_publisher(self, cmd: codec.DeclarePublisher) -> None:
        q = self._stream(cmd.stream)
        if not self._usable(q, cmd, "write"):
            return
        ref = cmd.reference or None
        if cmd.publisher_id in self.publishers or (ref is not None and len(ref) > MAX_REFERENCE):
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        sequence = -1
        if ref is not None:
            stored = q.log.query_offset(PUBLISHER_KEY + ref)
            sequence = -1 if stored is None else stored
        self.publishers[cmd.publisher_id] = Publisher(cmd.publisher_id, cmd.stream, q, ref,
                                                      sequence)
        self.is_publisher = True
        self._respond(cmd, codec.OK)

    def _delete_publisher(self, cmd: codec.DeletePublisher) -> None:
        if self.publishers.pop(cmd.publisher_id, None) is None:
            self._respond(cmd, codec.PUBLISHER_DOES_NOT_EXIST)
        else:
            self._respond(cmd, codec.OK)

    def _query_publisher_sequence(self, cmd: codec.QueryPublisherSequence) -> None:
        q = self._stream(cmd.stream)
        if not self._usable(q, cmd, "read", 0):
            return
        seq = None
        if cmd.reference:
            for pub in self.publishers.values():  # ahead of the log's table until commit
                if pub.reference == cmd.reference and pub.queue is q:
                    seq = pub.sequence
            if seq is None:
                seq = q.log.query_offset(PUBLISHER_KEY + cmd.reference)
        self._respond(cmd, codec.OK, max(seq or 0, 0))

    def _publish(self, cmd: codec.Publish) -> Iterator[None]:
        """A generator: it stops (yields) when inflating compressed sub-entries has used
        this turn's ``_step_budget``; the session goes on with it on a later turn of the
        event loop, so that a bomb does not hold every other connection."""
        pub = self.publishers.get(cmd.publisher_id)
        if pub is None or pub.queue.deleted:
            code = codec.PUBLISHER_DOES_NOT_EXIST if pub is None else codec.STREAM_DOES_NOT_EXIST
            self.conn.send(codec.encode_publish_error(
                cmd.publisher_id, [(m.publishing_id, code) for m in cmd.messages]))
            return
        lg = pub.queue.log
        confirms: list[int] = []
        # registered now: a failed write at the batch's end takes its ids out again
        self._confirms.append((lg, pub.id, confirms))
        refused: list[tuple[int, int]] = []
        limit = self.broker.config.max_message_size
        dedup = pub.reference is not None
        sequence = pub.sequence
        written = 0
        # the audit trail's records of this frame, built only while it is on
        audited: list | None = [] if self.audit is not None else None
        located: list[tuple[int, int]] = []  # (msg, offset) of what ``audited`` appended
        for m in cmd.messages:
            pid = m.publishing_id
            if lg.closed:  # deleted while this frame's inflating waited for its turn
                refused.append((pid, codec.STREAM_DOES_NOT_EXIST))
                continue
            if dedup and pid <= sequence:
                confirms.append(pid)  # a duplicate: confirmed, not written again
                continue
            data = m.data
            if isinstance(data, codec.SubEntry):
                if data.compression != codec.COMPRESSION_NONE:
                    if data.uncompressed_size > self._inflate_budget:
                        log.info("stream connection %s: compressed sub-entries of one read "
                                 "past %d bytes refused", self.peer, limit)
                        refused.append((pid, codec.PRECONDITION_FAILED))
                        continue
                    self._inflate_budget -= data.uncompressed_size
                try:
                    if data.compression == codec.COMPRESSION_NONE:
                        codec.check_subentry(data, limit)
                    else:
                        for inflated in codec.check_subentry_steps(data, limit):
                            self._step_budget -= inflated
                            if self._step_budget <= 0:
                                yield  # the rest on a later turn
                    if lg.closed:
                        refused.append((pid, codec.STREAM_DOES_NOT_EXIST))
                        continue
                except codec.CompressionError as exc:
                    log.info("stream connection %s: sub-entry batch refused: %s", self.peer,
                             exc.reason)
                    refused.append((pid, exc.code))
                    continue
                ids = None
                if audited is not None:
                    batch = [_audit_message(r, pub.stream)
                             for r in codec.subentry_records(data, limit)]
                    audited += ((message, pid) for message in batch)
                    ids = [message.id for message in batch]  # their offsets at the flush
                self._add_subentry(lg, codec.subentry_entry(data), data.count, pub.id, pid,
                                   (pub.queue, ids))
                written += data.count
            else:
                if len(data) > limit:
                    refused.append((pid, codec.PRECONDITION_FAILED))
                    if audited is not None:
                        self.broker.publishing.appended(
                            self, pub.queue, [(_audit_message(data, pub.stream), pid)],
                            NACKED)
                    continue
                if lg in self._runs:
                    self._flush_run(lg)  # in the order published
                try:
                    offset = lg.append_record(bytes(data), m.filter_value)
                except OSError as exc:  # the disk is full or failing: this one is refused
                    log.warning("stream %r: write failed (%s); publish refused", pub.stream,
                                exc)
                    refused.append((pid, codec.INTERNAL_ERROR))
                    continue
                written += 1
                if audited is not None:
                    message = _audit_message(data, pub.stream)
                    audited.append((message, pid))
                    located.append((message.id, offset))
            if pid > sequence:
                sequence = pid
            confirms.append(pid)
        if refused and dedup:
            # a refused id may come again: the sequence stays below it
            sequence = min(sequence, min(pid for pid, _code in refused) - 1)
        if dedup and sequence != pub.sequence:
            pub.sequence = sequence
            lg.store_offset(PUBLISHER_KEY + pub.reference, sequence)  # type: ignore[operator]
        q = pub.queue
        q.stats_published += written
        self.messages_published += written
        audit = self.audit
        if audited and audit is not None:
            self.broker.publishing.appended(self, q, audited)
            if located:
                audit.stream_appended(q, located)
        if refused:
            self.conn.send(codec.encode_publish_error(pub.id, refused))

    def _add_subentry(self, lg, entry: bytes, records: int, pub_id: int, pid: int,
                      audited: tuple) -> None:
        """Sub-entries wait for the end of the received batch to be one chunk (as osiris
        writes what its mailbox holds at once): a client that sends one Publish frame per
        sub-entry (rstream) does not make a chunk, a Deliver and a credit of each."""
        run = self._runs.get(lg)
        if run is not None and (len(run[0]) == MAX_CHUNK_ENTRIES
                                or run[2] + len(entry) > RUN_BYTES):
            self._flush_run(lg)
            run = None
        if run is None:
            run = self._runs[lg] = [[], 0, 0, [], audited[0], []]
        run[0].append(entry)
        run[1] += records
        run[2] += len(entry)
        run[3].append((pub_id, pid))
        if audited[1] is not None:  # the audit trail's message ids of its records
            run[5] += audited[1]

    def _flush_run(self, lg) -> None:
        run = self._runs.pop(lg, None)
        if run is None or lg.closed:
            return
        first = lg.next_offset  # its records take the offsets from here on
        try:
            lg.append_encoded(b"".join(run[0]), len(run[0]), run[1])
        except OSError as exc:  # nothing of it was written: its publishes are refused
            log.warning("stream log %s: write failed (%s); %d publishes refused",
                        lg.directory, exc, len(run[3]))
            self._refuse_written(lg, run[3])
            return
        audit = self.audit
        if run[5] and audit is not None:
            audit.stream_appended(run[4], [(msg, first + i) for i, msg in enumerate(run[5])])

    def _refuse_written(self, lg, ids: list[tuple[int, int]]) -> None:
        by_pub: dict[int, set[int]] = {}
        for pub_id, pid in ids:
            by_pub.setdefault(pub_id, set()).add(pid)
        for lg_, pub_id, confirms in self._confirms:
            if lg_ is lg and pub_id in by_pub:
                confirms[:] = [pid for pid in confirms if pid not in by_pub[pub_id]]
        for pub_id, pids in by_pub.items():
            self.conn.send(codec.encode_publish_error(
                pub_id, [(pid, codec.INTERNAL_ERROR) for pid in sorted(pids)]))
            pub = self.publishers.get(pub_id)
            if pub is not None and pub.reference is not None and pub.queue.log is lg:
                pub.sequence = min(pub.sequence, min(pids) - 1)
                lg.store_offset(PUBLISHER_KEY + pub.reference, pub.sequence)

    def _flush_publishes(self) -> None:
        """The end of a received batch: its sub-entries written, its confirms registered
        with the log (each once everything it appended is durable)."""
        for lg in list(self._runs):
            self._flush_run(lg)
        confirms, self._confirms = self._confirms, []
        for lg, pub_id, ids in confirms:
            if ids and not lg.closed:
                lg.when_durable(lg.next_offset - 1,
                                lambda pub_id=pub_id, ids=ids: self._confirm(pub_id, ids))

    def _confirm(self, pub_id: int, ids: list[int]) -> None:
        if self.ended:
            return
        self.conn.send(codec.encode_publish_confirm(pub_id, ids))
        self.wake()


def _audit_message(record, stream: str) -> Message:
    """A record as the audit trail reads a publish: its properties and body (a record
    this broker cannot read: its bytes as the body), to the stream's name as routing key,
    as a publish through the default exchange names its queue; persistent, as every
    record of a stream's log is."""
    record = bytes(record)
    try:
        exchange, _key, raw, properties, body = records.decode(record)
    except (ValueError, IndexError, RecursionError, struct.error):
        exchange, raw, properties, body = "", b"", {}, record
    message = Message(exchange, stream, raw, properties, body)
    message.persistent = True
    return message
