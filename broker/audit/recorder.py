"""The broker side of the audit trail: hot-path hooks, queue observer, drain task.

Every hook appends one record of ``events.WIDTH`` slots (a compact tuple, ``events.py``,
padded) to the flat list ``AuditTrail.buf``: no encoding, no task, and no object that
outlives the hook (the record's tuple is copied into the list and freed), so the buffer
adds nothing for the cyclic GC to count or traverse. One task (``AuditTrail.run``, in the server's
nursery) swaps the buffer every ``flush_interval`` seconds and numbers the batch; a worker
thread serialises it and appends it to the spool (``spool.py``); the converter process
(``writer.py``) encodes Avro.

When the writer cannot keep up the buffer reaches ``buffer_events``; then the policy
decides. ``block``: a resource alarm ("audit trail") blocks publishing connections, as a
memory alarm does, until the buffer is back under half; events of publishes already read
are still kept (up to twice the bound). ``drop``: events past the bound are counted and not
kept; the count is recorded as an ``audit_dropped`` event.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..cluster.link import LINK_USER
from ..message import set_message_id_floor
from ..queues.ops import CallerReported, Op
from ..queues.stream import StreamQueue
from . import events
from .events import CAN, DACK, ENQ, FIRE, LEFT, REJ, RETRY, SCH, STRA, STRD, STREAM, STRT, TRAIL, WIDTH
from .hooks import CHooks, PyHooks, chosen
from .spool import Spool, dumps, last_spooled_seq, loads, spool_dir

if TYPE_CHECKING:
    from ..broker import Broker
    from ..policies import Policies
    from ..queues.entry import QueueEntry
    from ..queues.queue import Queue
    from ..services import AuditServices
    from ..vhost import VirtualHost

log = logging.getLogger("broker.audit")

_time = time.time
_ENQUEUE, _DELIVER, _REQUEUE, _SETTLE, _EXPIRE, _DEAD_LETTER, _PURGE, _DELETE = (
    Op.ENQUEUE, Op.DELIVER, Op.REQUEUE, Op.SETTLE, Op.EXPIRE, Op.DEAD_LETTER, Op.PURGE, Op.DELETE)
ALARM = "audit trail"
_PAD = [(None,) * (WIDTH - n) for n in range(WIDTH + 1)]  # a record of n slots -> WIDTH
_TRUE = (True, "true", "on", "yes", 1)
_FALSE = (False, "false", "off", "no", 0)
KEEP_CHUNKS = 4  # the buffer holds up to this many chunks; the oldest is serialised


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class AuditTrail(CallerReported):
    """Records lifecycle events of audited queues and vhosts; owns the writer process.

    Selection: a queue is audited when its effective policy (``broker.policies``) has the
    key ``audit`` set to true, or -- without such a key -- when the scope is ``all``
    (``--audit-dir`` alone: broker-wide). A publish is recorded when its vhost is audited
    (scope ``all``, or the vhost has at least one audited queue).
    """

    # the batch clock of the hooks a trail class mixes in (hooks.PyHooks or the C ones)
    clock_start: Callable[[], None]
    clock_stop: Callable[[], None]
    published: Callable[..., None]  # and its publish hook (publishing.PublishAudit),
    delivered: Callable[..., int]  # the delivery hook (its position, for the ack)
    acked: Callable[..., None]

    def __init__(self, services: AuditServices, policies: Policies, settings) -> None:
        self.services = services  # the composition root's, never the whole broker
        self.policies = policies
        self.settings = settings
        self.buf: list = []  # flat: WIDTH slots per event
        # serialised chunks of events, (count, data), waiting for the drain task
        self.held: list[tuple[int, bytes]] = []
        self.held_events = 0
        self.base = 0  # the position of buf[0] among every slot recorded (``delivered``)
        self.chunk = min(settings.chunk_events, settings.buffer_events) * WIDTH
        # The hooks' test: past it, ``_full`` seals the oldest chunk or applies the policy.
        # The newest events stay: most deliveries are acked while their record is here.
        self.limit = min(KEEP_CHUNKS * settings.chunk_events,
                         settings.buffer_events) * WIDTH
        self._scope_all = settings.scope == "all"
        self.dropped = 0  # not yet reported in an audit_dropped event
        self.dropped_total = 0
        self.sent = 0
        self.next_seq = 1
        self.spool: Any = None  # the Spool, once run() started
        self._spool_full = False
        self.blocking = False
        # The time of the receive batch being handled (``clock_start``), else 0.0: events
        # of one batch share the time its bytes were read, one clock read per batch.
        self.now = 0.0
        self._audited: set = set()  # Queue objects this trail observes
        self._vhosts_on: dict[str, int] = {}  # vhost name -> audited queues in it
        self._hooked: set[str] = set()
        self._policies_hooked = False
        self._proc: Any = None
        self.sink: Any = None
        if settings.stream:
            from .stream_sink import StreamSink
            self.sink = StreamSink(services, settings.stream, settings.node)

    # ---- selection ----
    def _policy_audit(self, q):
        policies = self.policies
        try:
            definition = policies.effective(q.vhost.name, "queue", q.name)[2]
        except Exception:  # a policy store that is not ready must not break declares
            log.exception("audit: cannot read the policy of queue %r", q.name)
            return None
        value = definition.get("audit") if isinstance(definition, dict) else None
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        return None

    def queue_audited(self, q) -> bool:
        if q.internal or (self.sink is not None and self.sink.is_sink(q)):
            return False
        chosen = self._policy_audit(q)
        return self.settings.scope == "all" if chosen is None else chosen

    def vhost_audited(self, name: str) -> bool:
        return self.settings.scope == "all" or self._vhosts_on.get(name, 0) > 0

    def hook_vhosts(self) -> None:
        """Follow every vhost's queues (new vhosts are picked up by the drain task)."""
        policies = self.policies
        if not self._policies_hooked:
            self._policies_hooked = True
            policies.on_change.append(self.policies_changed)
        for vhost in list(self.services.vhosts.values()):
            if vhost.name in self._hooked:
                continue
            self._hooked.add(vhost.name)
            vhost.on_queue_added.append(self.queue_added)
            vhost.on_queue_deleted.append(self._queue_deleted)
            for q in list(vhost.queues.values()):
                self.queue_added(q)

    def queue_added(self, q) -> None:
        if self.queue_audited(q):
            self._observe(q)

    def _observe(self, q) -> None:
        if q in self._audited:
            return
        self._audited.add(q)
        if q.queue_type.name == STREAM:
            # a stream's deliveries name records by offset (events.STREAM); what retention
            # removed before (at the start, while not audited) is truncated, once more
            # (another node's stream, read here from this node's copy or through the link
            # to its leader, is followed the same way: its deliveries name offsets too; the
            # leader's trail has its appends and truncations)
            q.audit_ctx = (q.vhost.name, q.name, STREAM)
            if isinstance(q, StreamQueue) and q.log.first_offset > 0:
                self._add((STRT, _time(), q.vhost.name, q.name, 0, q.log.first_offset,
                           "retention"))
        else:
            q.audit_ctx = (q.vhost.name, q.name)  # shared by the queue's events (events.DELC)
        q.observers.append(self)
        name = q.vhost.name
        self._vhosts_on[name] = self._vhosts_on.get(name, 0) + 1

    def _forget(self, q) -> None:
        if q not in self._audited:
            return
        self._audited.discard(q)
        q.audit_ctx = None
        if self in q.observers:
            q.observers.remove(self)
        name = q.vhost.name
        self._vhosts_on[name] = self._vhosts_on.get(name, 1) - 1

    def _queue_deleted(self, q, consumers) -> None:
        # DELETE ops of entries still unacked come later; keep observing them (the queue
        # object is gone from the vhost, nothing else will reach it).
        self._audited.discard(q)
        q.audit_ctx = None
        name = q.vhost.name
        if self._vhosts_on.get(name):
            self._vhosts_on[name] -= 1

    def policies_changed(self, vhost_name: str) -> None:
        """``broker.policies.on_change`` callback: re-select the vhost's queues."""
        vhost = self.services.vhosts.get(vhost_name)
        if vhost is None:
            return
        for q in list(vhost.queues.values()):
            if self.queue_audited(q):
                self._observe(q)
            else:
                self._forget(q)

    # ---- the bounded buffer ----
    def events(self) -> list[tuple]:
        """The events not yet spooled, as tuples (without their padding)."""
        out = []
        for _, data in self.held:
            out += [ev[:events.ARITY[ev[0]]] for ev in loads(data)]
        return out + events.rows(self.buf, trim=True)

    def _add(self, ev: tuple) -> None:
        """Buffer one event of a less common kind (padded to WIDTH)."""
        buf = self.buf
        buf += ev + _PAD[len(ev)]
        if len(buf) > self.limit:
            self._full()

    def _full(self) -> None:
        """The buffer passed ``limit``: serialise it as a chunk, or -- when the writer is
        behind by ``buffer_events`` -- apply the policy."""
        bound = self.settings.buffer_events
        pending = self.held_events + len(self.buf) // WIDTH
        if pending > bound:
            if self.settings.policy == "drop" or pending > 2 * bound:
                del self.buf[-WIDTH:]
                self.dropped += 1
                self.dropped_total += 1
                return
            if not self.blocking:
                self.blocking = True
                self.services.set_alarm(ALARM, True)
        if len(self.buf) >= self.limit:
            self._seal(self.chunk)

    def _seal(self, slots: int | None = None) -> None:
        """Serialise the oldest ``slots`` of the buffer (all of it by default)."""
        buf = self.buf
        if slots is None or slots >= len(buf):
            batch, self.buf = buf, []
        else:
            batch = buf[:slots]
            del buf[:slots]
        self.base += len(batch)
        if batch:
            count = len(batch) // WIDTH + batch[::WIDTH].count(DACK)
            self.held.append((count, dumps(batch)))
            self.held_events += count

    @staticmethod
    def _channel_ctx(channel) -> tuple:
        """The channel's part of its events, one shared tuple (``events.PUBC``)."""
        session = channel.session
        user = session.conn.username
        ctx: tuple = (channel.vhost.name, user, session.peer, channel.number)
        if user == LINK_USER:
            # another node's link: what it is delivered goes on to a consumer of that node,
            # whose trail records the delivery (a stream's: detail ``forwarded`` here)
            ctx += (events.FORWARDED,)
        channel.audit_ctx = ctx
        return ctx

    def rejected(self, channel, taken: list, requeue: bool, name: str) -> None:
        t = _time()
        for item in taken:
            queue = item.queue
            if queue not in self._audited:
                continue
            consumer = item.consumer
            self._add((REJ, t, queue.vhost.name, queue.name, item.entry.message.id,
                       consumer.tag if consumer is not None else None, item.tag,
                       channel.session.peer, channel.number, requeue, name))

    # ---- hooks: the queue operation stream (queues/ops.py QueueObserver) ----
    # Deliveries, clients' publishes and acks are recorded by the sessions, which know the
    # consumer, the channel and the delivery tag: the queue does not report them here
    # (CallerReported).

    def queue_op(self, queue: Queue, op, entry: QueueEntry) -> None:
        if op is _ENQUEUE:
            # not a client's publish (a dead letter, a scheduled firing): its properties
            # link it to the original (message id, x-ref-key)
            msg = entry.message
            self._add((ENQ, _time(), queue.vhost.name, queue.name, msg.id, msg.properties))
            return
        elif op is _SETTLE:
            reason = queue.leave_reason
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "dropped" if reason == "maxlen" else "settled", reason, None))
        elif op is _REQUEUE:
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "requeued", None, None))
        elif op is _DEAD_LETTER:
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "dead_lettered", queue.leave_reason,
                       queue.opts.dead_letter_exchange))
        elif op is _EXPIRE:
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "expired", "expired", queue.opts.dead_letter_exchange))
        elif op is _PURGE:
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "purged", None, None))
        elif op is _DELETE:
            self._add((LEFT, _time(), queue.vhost.name, queue.name, entry.message.id,
                       "deleted", None, None))

    # ---- hooks: streams, whose records are named by their offsets ----
    def stream_appended(self, queue: Queue, pairs) -> None:
        """``pairs``: (message id, offset) of records just appended to the stream
        ``queue`` (after their ``published`` events)."""
        qctx = queue.audit_ctx
        if qctx is None:
            return
        t = self.now or _time()
        vhost, name = qctx[0], qctx[1]
        for msg, offset in pairs:
            self._add((STRA, t, vhost, name, msg, offset))

    def stream_delivered(self, origin, queue: Queue, ctag: str, first: int, count: int,
                         detail: str | None = None) -> None:
        """A Stream-protocol subscription (``ctag``, its id; ``detail``, its name) was
        sent the records ``first`` .. ``first + count - 1`` of ``queue`` (a chunk)."""
        qctx = queue.audit_ctx
        if qctx is None or count <= 0:
            return
        ctx = origin.audit_ctx
        self._add((STRD, self.now or _time(), qctx[0], qctx[1], ctag, None, first, count,
                   ctx[2], ctx[3], detail))

    def stream_truncated(self, queue: Queue, first: int, count: int, reason: str) -> None:
        """Records ``first`` .. ``first + count - 1`` left the stream ``queue`` (retention,
        the stream deleted)."""
        qctx = queue.audit_ctx
        if qctx is None or count <= 0:
            return
        self._add((STRT, _time(), qctx[0], qctx[1], first, count, reason))

    # ---- hooks: scheduler and retries ----
    def scheduled(self, vhost: VirtualHost, message, due: float) -> None:
        if not self.vhost_audited(vhost.name):
            return
        self._add((SCH, _time(), vhost.name, message.exchange, message.routing_key,
                   message.id, message.properties, due))

    def fired(self, vhost_name: str, message, due: float, queues: list) -> None:
        if not self.vhost_audited(vhost_name):
            return
        self._add((FIRE, _time(), vhost_name, message.exchange, message.routing_key,
                   message.id, message.properties, due, [q.name for q in queues]))

    def cancelled(self, vhost_name: str, sid: str) -> None:
        if not self.vhost_audited(vhost_name):
            return
        self._add((CAN, _time(), vhost_name, sid))

    def retried(self, queue: Queue, entry: QueueEntry, delay_ms: int) -> None:
        if queue not in self._audited:
            return
        self._add((RETRY, _time(), queue.vhost.name, queue.name, entry.message.id,
                   entry.delivery_count, f"delay {delay_ms} ms"))

    # ---- the drain task, the spool and the converter process ----
    def converter_command(self) -> list[str]:
        s = self.settings
        return [sys.executable, "-m", "broker.audit.writer", "--dir", s.dir, "--node", s.node,
                "--roll-bytes", str(s.roll_bytes), "--roll-seconds", str(s.roll_seconds),
                "--codec", s.codec]

    async def _start_converter(self):
        env = dict(os.environ)
        root = _package_root()
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return await trio.lowlevel.open_process(self.converter_command(), env=env)

    def _take_frames(self, everything: bool = True) -> tuple[list[tuple[int, int, bytes]], int]:
        """What is buffered, as numbered frames ``(first seq, count, data)``, and how many
        of their events are ``audit_dropped`` reports.

        Not ``everything``: while the hooks serialise chunks (a busy broker), the newest
        events stay in the buffer for the next chunk, so the drain task does not serialise
        thousands of events at once on the event loop; when no chunk came since the last
        drain, the buffer goes too (a quiet broker's events reach the spool in time)."""
        reports = 0
        if self.dropped:
            self.buf += (TRAIL, _time(), "audit_dropped", self.dropped,
                         f"policy {self.settings.policy}: events not recorded") + _PAD[5]
            self.dropped = 0
            reports = 1
            everything = True
        if everything or not self.held:
            self._seal()
        frames = []
        for count, data in self.held:
            frames.append((self.next_seq, count, data))
            self.next_seq += count
        self.held = []
        self.held_events = 0
        return frames, reports

    def _open_spool(self) -> None:
        """Continue the sequence after what is on disk; note how the last run ended."""
        root = self.settings.dir
        self.spool = Spool(root)
        from .writer import last_state
        last = max(last_state(root, self.settings.node)[0], last_spooled_seq(root))
        marker = os.path.join(spool_dir(root), "closed")
        previous = ("first run" if last == 0 else
                    "previous run ended cleanly" if os.path.exists(marker) else
                    "previous run did not stop cleanly: its unsent tail is lost")
        if os.path.exists(marker):
            os.remove(marker)
        self.next_seq = last + 1
        started = [TRAIL, _time(), "node_started", None, previous, *_PAD[5]]
        self.held.insert(0, (1, dumps(started)))  # before what the hooks recorded so far
        self.held_events += 1

    async def _flush(self, everything: bool = True) -> None:
        """Append what is buffered to the spool (a worker thread does the writes)."""
        frames, reports = self._take_frames(everything)
        if not frames:
            return
        total = sum(count for _, count, _ in frames)
        if self._spool_full and self.settings.policy == "drop":
            lost = total - reports
            self.dropped += lost
            self.dropped_total += lost
            return
        try:
            await trio.to_thread.run_sync(self._spool_frames, frames)
            self.sent += total
            if self.sink is not None:
                await self._to_stream(frames)
        except OSError as exc:  # the sequence keeps the hole: the trail shows the loss
            self.dropped_total += total
            log.error("audit spool write failed (%s): events %d-%d lost", exc, frames[0][0],
                      frames[0][0] + total - 1)

    async def _to_stream(self, frames: list[tuple[int, int, bytes]]) -> None:
        from .stream_sink import bodies
        try:
            messages = await trio.to_thread.run_sync(bodies, frames, self.settings.node)
            self.sink.publish(messages)
        except Exception:  # the stream is a copy: the files (and the broker) go on
            log.exception("audit stream %r: events %d-%d not published", self.sink.name,
                          frames[0][0], frames[-1][0] + frames[-1][1] - 1)

    def _spool_frames(self, frames: list[tuple[int, int, bytes]]) -> None:
        self.spool.append_frames(frames)

    def _check_backlog(self) -> None:
        """The converter lags more than ``spool_max`` bytes: apply the policy."""
        full = self.spool.bytes_waiting() > self.settings.spool_max
        if full != self._spool_full:
            self._spool_full = full
            log.warning("audit spool %s %d bytes", "above" if full else "back under",
                        self.settings.spool_max)

    def _update_alarm(self) -> None:
        pending = self.held_events + len(self.buf) // WIDTH
        want = self.settings.policy == "block" and (
            self._spool_full or (pending > self.settings.buffer_events // 2 and self.blocking))
        if want != self.blocking:
            self.blocking = want
            self.services.set_alarm(ALARM, want)

    async def run(self) -> None:
        """The drain task: one frame per ``flush_interval``; at shutdown, the tail."""
        os.makedirs(self.settings.dir, exist_ok=True)
        self._open_spool()
        self._proc = await self._start_converter()
        ticks = 0
        try:
            while True:
                await trio.sleep(self.settings.flush_interval)
                self.hook_vhosts()  # vhosts created since, a policy module installed late
                await self._flush(everything=False)
                ticks += 1
                if ticks % 20 == 0:
                    self._check_backlog()
                    if self._proc.returncode is not None:
                        log.error("audit converter exited with %s; restarting it",
                                  self._proc.returncode)
                        self._proc = await self._start_converter()
                self._update_alarm()
        finally:
            with trio.CancelScope(shield=True):
                self.buf += (TRAIL, _time(), "node_stopped", None, "clean shutdown") + _PAD[5]
                self._spool_full = False
                await self._flush()
                await trio.to_thread.run_sync(self.spool.close, True)
                if self.blocking:
                    self.blocking = False
                    self.services.set_alarm(ALARM, False)
                # the converter finishes what is spooled and exits; what it cannot convert
                # in time stays in the spool for the next start
                with trio.move_on_after(self.settings.stop_timeout):
                    await self._proc.wait()
                if self._proc.returncode is None:
                    self._proc.terminate()
                    with trio.move_on_after(5):
                        await self._proc.wait()
                    if self._proc.returncode is None:
                        self._proc.kill()


def last_msg_id(root: str, node: str) -> int:
    """The highest message id in the newest readable file of ``node`` (0 if none)."""
    from .reader import FileReader
    from .writer import node_files
    for path in reversed(node_files(root, node)):
        best = 0
        for rec in FileReader(path).last_records():
            if rec["msg"] is not None and rec["msg"] > best:
                best = rec["msg"]
        if best:
            return best
    return 0


def install(broker: Broker, services: AuditServices) -> AuditTrail | None:
    """Turn the trail on when ``broker.config.audit.dir`` is set; returns it (or None)."""
    settings = broker.config.audit
    if not settings.dir:
        return None
    if not settings.node:
        settings.node = socket.gethostname()
    trail = (CTrail if chosen() is CHooks else PyTrail)(services, broker.policies, settings)
    # Message ids restart at 1 in a broker without stored messages: continue above the
    # trail's, so (node, vhost, queue, msg) names one message copy across restarts.
    set_message_id_floor(last_msg_id(settings.dir, settings.node))
    trail.hook_vhosts()
    broker.recovery_hooks.append(trail.hook_vhosts)
    broker.background_tasks.append(trail.run)
    return trail


# The trail on each set of hooks (``hooks.py``): the C ones when built, and their Python
# reference; ``install`` takes the one ``hooks.chosen()`` names when the broker starts.
class CTrail(AuditTrail, CHooks):
    pass


class PyTrail(AuditTrail, PyHooks):
    pass


__all__ = ["ALARM", "AuditTrail", "CTrail", "PyTrail", "events", "install"]
