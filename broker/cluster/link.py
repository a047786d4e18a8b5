"""Node-to-node links: this node as an AMQP 0-9-1 client of another node.

A link is one AMQP connection from this node to a queue's master node, for one vhost,
authenticated as the cluster's link user (``LINK_USER``) with a password derived from the
cluster secret, so only a node that has the secret can open one. It speaks the protocol
every client speaks, so the master needs nothing new to serve it except the publish hook
in ``forward.py`` that restores a forwarded message's exchange and routing key:

* channel 1 carries definitions (queue.declare, queue.bind, ...) in order, without waiting
  for their replies: the master handles a connection's frames in order, so a declare sent
  before a publish is done before it;
* channel 2 is in confirm mode and carries forwarded publishes; each carries a callback
  called with True when the master confirmed it, False when it nacked it, None when the
  link went down (or the peer stayed silent for ``confirm_timeout``) before it answered:
  the publish is then in doubt;
* channels 3 and up carry one proxied consumer each (``RemoteConsumer``), with a prefetch
  window, so what the master sends is bounded.

Bounded: at most ``max_inflight`` unconfirmed publishes and ``max_buffered`` bytes waiting
to be written; past either, ``on_pressure(True)`` (the broker blocks its publishers, as a
resource alarm) until both are back under half. The peer's connection.blocked alone does
not raise it (see ``_check_pressure``).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ..amqp import spec
from ..amqp.codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FrameError,
    FrameReader,
    content_frames,
    method_frame,
    parse_content_header,
)
from ..amqp.connection import MAX_MESSAGE_SIZE
from ..amqp.spec import UnknownMethod

log = logging.getLogger("broker.cluster.link")

#: the user links log in as (created by the cluster on every node, password from the secret)
LINK_USER = "triomq-cluster-link"
#: header a link adds to a forwarded publish: [exchange, routing key] of the original publish
ROUTE_HEADER = "x-triomq-route"
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_MAX = 131072
# A content the peer declares larger than this ends the link: no node sends one (the
# largest message a node accepts), and its parts would be held until the declared end.
_MAX_CONTENT = MAX_MESSAGE_SIZE
_CONTROL = 1
_PUBLISH = 2


def link_password(secret: bytes | None, prefix: str) -> str:
    """The link user's password: only nodes with the cluster secret can compute it."""
    key = secret if secret is not None else b"triomq-no-secret"
    return hmac.new(key, b"triomq-link\0" + prefix.encode(), hashlib.sha256).hexdigest()


# consume arguments a proxied consumer passes on to the master (a stream consumer's
# starting point and filter are what it reads: without them it read from "next")
_CONSUMER_ARGS = frozenset(("x-priority", "x-stream-offset", "x-stream-filter",
                            "x-stream-match-unfiltered"))


def forward_properties(properties: dict, exchange: str, routing_key: str,
                       extra: dict | None = None) -> bytes:
    """A forwarded publish's encoded properties: its own, with the route header (and
    ``extra`` headers) added (``Link.publish_raw`` takes them encoded, so a publish sent
    on several links is encoded once)."""
    from ..amqp.fields import encode_properties
    props = dict(properties)
    headers = dict(props.get("headers") or {})
    headers[ROUTE_HEADER] = [exchange, routing_key]
    if extra:
        headers.update(extra)
    props["headers"] = headers
    return encode_properties(props)


class LinkClosed(Exception):
    """The link's connection ended (peer closed, socket error, refused login)."""


# the link's connection is over: reconnect (a malformed frame from the peer included)
_BROKEN = (OSError, LinkClosed, trio.BrokenResourceError, trio.ClosedResourceError,
           trio.TooSlowError, FrameError, ValueError, UnknownMethod)


class DeliveryTarget(Protocol):
    """What a link hands a proxied consumer's deliveries and cancellation to."""

    def remote_delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str,
                         props_raw: bytes, body: bytes) -> None: ...

    def remote_cancelled(self, reason: str) -> None: ...


class RemoteConsumer:
    """One proxied consumer: a channel of the link consuming the master's queue."""

    def __init__(self, link: Link, queue: str, no_ack: bool, prefetch: int, arguments: dict,
                 target: DeliveryTarget):
        self.link = link
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.arguments = arguments
        self.target = target
        self.channel = 0  # link channel while subscribed, 0 while the link is down
        self.generation = 0  # link connection the outstanding tags belong to
        self.cancelled = False

    def settle(self, tag: int, generation: int, how: str) -> None:
        """Ack ("ack"), reject ("reject") or requeue ("requeue") a delivery of this
        consumer; a tag of an earlier link connection is void (the master requeued it)."""
        if generation != self.generation or not self.channel:
            return
        if how == "ack":
            m = spec.Basic.Ack(tag, False)
        elif how == "reject":
            m = spec.Basic.Reject(tag, False)
        else:
            m = spec.Basic.Nack(tag, False, True)
        self.link.send(method_frame(self.channel, m))

    def cancel(self) -> None:
        """The local consumer is gone: the link channel closes (the master requeues what
        this consumer had unacked)."""
        if self.cancelled:
            return
        self.cancelled = True
        self.link.consumers.pop(self.channel, None)
        if self.channel and self.link.connected:
            self.link.send(method_frame(self.channel, spec.Channel.Close(200, "consumer cancelled",
                                                                        0, 0)))
            self.link.closing.add(self.channel)
        self.channel = 0


class Link:
    """The link to ``node`` (AMQP at ``address``) for ``vhost``; ``run()`` in the cluster's
    nursery keeps it connected until cancelled."""

    def __init__(self, node: str, address: str, vhost: str, password: str,
                 on_pressure: Callable[[bool], None], max_inflight: int = 2000,
                 max_buffered: int = 8 << 20, control_backlog: int = 10000,
                 confirm_timeout: float = 5.0):
        self.node = node
        self.address = address
        self.vhost = vhost
        self.password = password
        self.on_pressure = on_pressure
        self.max_inflight = max_inflight
        self.max_buffered = max_buffered
        # a peer that answers no confirm for this long (paused, partitioned) is dropped:
        # what it owes is nacked and the link connects again
        self.confirm_timeout = confirm_timeout
        self.connected = False
        # a connection attempt failed since the link was last up: publishes are nacked at
        # once instead of held until it connects
        self.failing = False
        self._held: list[tuple] = []  # publishes made before the first connection
        self._held_since = 0.0  # when the oldest of them was held
        self.blocked = False  # the master sent connection.blocked
        self.pressure = False
        self.generation = 0
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._wake = trio.Event()
        self._seq = 0
        # seq -> (done, time sent) of the publishes the peer has not confirmed yet
        self._pending: OrderedDict[int, tuple[Callable[[bool | None], None], float]] = \
            OrderedDict()
        # definitions kept to send (again) when (re)connected, bounded
        self._control: deque[bytes] = deque(maxlen=control_backlog)
        self.consumers: dict[int, RemoteConsumer] = {}  # link channel -> consumer
        self._waiting: list[RemoteConsumer] = []  # to subscribe once connected
        self.closing: set[int] = set()  # channels we closed, awaiting close-ok
        self._next_channel = 3
        self.last_error = ""
        self.forwarded = 0
        self.confirmed = 0
        # the frame size negotiated with the peer: every frame sent is at most this
        self.frame_max = _FRAME_MAX

    # ---- used by the proxies (synchronous) ----
    def send(self, frame: bytes) -> None:
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._wake.set()
        self._check_pressure()

    def _send_many(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        self._out_bytes += sum(len(f) for f in frames)
        self._wake.set()
        self._check_pressure()

    def control(self, method: spec.Method) -> None:
        """A definition for the master (declare, bind, unbind, delete, purge): sent in
        order, replayed after a reconnect (they are idempotent)."""
        frame = method_frame(_CONTROL, method)
        self._control.append(frame)
        if self.connected:
            self.send(frame)

    def publish(self, queue: str, exchange: str, routing_key: str, properties: dict,
                body: bytes, done: Callable[[bool | None], None],
                extra: dict | None = None) -> bool:
        """Forward a publish to ``queue`` on the master; ``done(ok)`` once decided. False
        (nothing sent, ``done`` not called) while the link is down or when its properties
        would not fit in one frame of the negotiated size; held (bounded) while it connects
        for the first time or again after a clean break. The body is cut in frames of the
        negotiated size."""
        if not self.connected:
            return self._hold((queue, exchange, routing_key, properties, body, done, extra))
        return self.publish_raw(queue, forward_properties(properties, exchange, routing_key,
                                                          extra), body, done)

    def publish_raw(self, queue: str, props_raw: bytes, body: bytes,
                    done: Callable[[bool | None], None], frames: dict | None = None) -> bool:
        """``publish`` with its properties encoded (``forward_properties``). ``frames``: a
        dict the callers sending the same publish on several links share (frame size ->
        the publish's frames), so its frames are built once."""
        if not self.connected:
            return self._hold((queue, None, props_raw, None, body, done, frames))
        if len(props_raw) + 21 > self.frame_max:
            # a content header is one frame: the peer would close the link (501), so this
            # publish is refused (nacked) instead; callers keep their headers small
            return False
        self._seq += 1
        self._pending[self._seq] = (done, trio.current_time())
        built = frames.get(self.frame_max) if frames is not None else None
        if built is None:
            built = [method_frame(_PUBLISH, spec.Basic.Publish(0, "", queue, False, False)),
                     *content_frames(_PUBLISH, props_raw, body, self.frame_max)]
            if frames is not None:
                frames[self.frame_max] = built
        self.forwarded += 1
        self._send_many(built)
        return True

    def _hold(self, item: tuple) -> bool:
        """A publish made while the link connects (``item[5]`` its ``done``; ``item[1]``
        None: a ``publish_raw``), sent once it is up; False when it cannot wait."""
        if self.failing or len(self._held) >= self.max_inflight:
            return False
        if not self._held:
            self._held_since = trio.current_time()
        self._held.append(item)
        return True

    def _replay(self, item: tuple) -> bool:
        if item[1] is None:
            return self.publish_raw(item[0], item[2], item[4], item[5], item[6])
        return self.publish(*item)

    def consume(self, rc: RemoteConsumer) -> None:
        if self.connected:
            self._subscribe(rc)
        else:
            self._waiting.append(rc)

    def _subscribe(self, rc: RemoteConsumer) -> None:
        channel = self._next_channel
        self._next_channel += 1
        rc.channel = channel
        rc.generation = self.generation
        self.consumers[channel] = rc
        window = rc.prefetch if 0 < rc.prefetch <= 1000 else 200
        args = {k: v for k, v in rc.arguments.items() if k in _CONSUMER_ARGS}
        self._send_many([method_frame(channel, spec.Channel.Open("")),
                         method_frame(channel, spec.Basic.Qos(0, window, False)),
                         method_frame(channel, spec.Basic.Consume(0, rc.queue, "", False, False,
                                                                  False, False, args))])

    # ---- pressure ----
    def _check_pressure(self) -> None:
        # The peer blocking this link (its own alarm) is not pressure by itself: our alarm
        # would block the peer's link into this node, whose mirror ops the peer waits on to
        # clear its alarm (two nodes linked both ways then blocked each other for good).
        # What the peer does not take piles up here and raises the alarm at the bounds.
        over = len(self._pending) >= self.max_inflight or self._out_bytes >= self.max_buffered
        under = (len(self._pending) <= self.max_inflight // 2
                 and self._out_bytes <= self.max_buffered // 2)
        if over and not self.pressure:
            self.pressure = True
            self.on_pressure(True)
        elif under and self.pressure:
            self.pressure = False
            self.on_pressure(False)

    # ---- the connection ----
    async def held_watchdog(self) -> None:
        """Publishes held for a first connection that does not come within
        ``confirm_timeout`` (the peer's address unknown: it is down; a connect that hangs)
        are nacked -- never sent, so not in doubt -- and the next ones at once until the
        link is up: a publisher always gets an answer within the failover time."""
        while True:
            await trio.sleep(min(0.5, self.confirm_timeout / 4))
            if self._held and trio.current_time() - self._held_since > self.confirm_timeout:
                self.failing = True
                held, self._held = self._held, []
                for item in held:
                    item[5](False)

    async def run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._connect_and_serve()
            except _BROKEN as exc:
                text = str(exc) or type(exc).__name__
                if text != self.last_error:
                    log.warning("link to node %r (%s, vhost %r): %s", self.node, self.address,
                                self.vhost, text)
                self.last_error = text
            except Exception:  # a bug here must not take the broker down: reconnect
                log.exception("link to node %r (vhost %r) failed", self.node, self.vhost)
                self.last_error = "internal error"
            finally:
                self._down()
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _down(self) -> None:
        self.connected = False
        self.failing = True
        held, self._held = self._held, []
        for item in held:
            item[5](False)  # never sent (held for a connection that did not come): nacked
        self._out.clear()
        self._out_bytes = 0
        pending, self._pending = self._pending, OrderedDict()
        for done, _t in pending.values():
            done(None)  # in doubt: the master may have it or not
        for rc in list(self.consumers.values()):
            rc.channel = 0
            if not rc.cancelled:
                self._waiting.append(rc)
        self.consumers.clear()
        self.closing.clear()
        self._check_pressure()

    async def _connect_and_serve(self) -> None:
        host, _, port = self.address.rpartition(":")
        # a peer that does not answer the SYN (partitioned, paused host): not the OS's
        # minutes of retries, while publishes wait to be sent
        with trio.fail_after(max(self.confirm_timeout, 1.0)):
            stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            reader = FrameReader(_FRAME_MAX)
            await stream.send_all(_PROTOCOL_HEADER)
            frames: deque = deque()

            async def method(expect: type) -> Any:
                while True:
                    while not frames:
                        data = await stream.receive_some(65536)
                        if not data:
                            raise LinkClosed("connection closed by the peer during the handshake")
                        frames.extend(reader.feed(data))
                    ftype, _channel, payload = frames.popleft()
                    if ftype != FRAME_METHOD:
                        continue
                    m = spec.decode_method(payload)
                    if isinstance(m, spec.Connection.Close):
                        raise LinkClosed(f"refused: {m.reply_code} {m.reply_text}")
                    if isinstance(m, expect):
                        return m

            with trio.fail_after(10):
                await method(spec.Connection.Start)
                response = b"\0" + LINK_USER.encode() + b"\0" + self.password.encode()
                await stream.send_all(method_frame(0, spec.Connection.StartOk(
                    {"product": "TrioMQ cluster link", "capabilities": {
                        "publisher_confirms": True, "consumer_cancel_notify": True,
                        "connection.blocked": True}},
                    "PLAIN", response, "en_US")))
                tune = await method(spec.Connection.Tune)
                frame_max = min(tune.frame_max or _FRAME_MAX, _FRAME_MAX)
                self.frame_max = frame_max
                await stream.send_all(method_frame(0, spec.Connection.TuneOk(
                    tune.channel_max or 2047, frame_max, 0)))
                await stream.send_all(method_frame(0, spec.Connection.Open(self.vhost, "", False)))
                await method(spec.Connection.OpenOk)
            self.generation += 1
            self._next_channel = 3
            self._seq = 0
            self.blocked = False
            hello = [method_frame(_CONTROL, spec.Channel.Open("")),
                     method_frame(_PUBLISH, spec.Channel.Open("")),
                     method_frame(_PUBLISH, spec.Confirm.Select(False))]
            self._out = hello + list(self._control) + self._out
            self._out_bytes = sum(len(f) for f in self._out)
            self.connected = True
            self.failing = False
            self.last_error = ""
            held, self._held = self._held, []
            for item in held:
                if not self._replay(item):
                    item[5](False)  # too large a header for this peer: nacked
            log.info("link to node %r (%s, vhost %r) up", self.node, self.address, self.vhost)
            waiting, self._waiting = self._waiting, []
            for rc in waiting:
                if not rc.cancelled:
                    self._subscribe(rc)
            self._wake.set()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, stream)
                    nursery.start_soon(self._watchdog)
                    await self._reader(stream, reader, frames)
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                broken, rest = group.split(_BROKEN)
                if rest is not None:
                    raise
                assert broken is not None
                raise LinkClosed(str(broken.exceptions[0])) from None

    async def _watchdog(self) -> None:
        while True:
            await trio.sleep(min(0.5, self.confirm_timeout / 4))
            pending = self._pending
            if pending and trio.current_time() - next(iter(pending.values()))[1] \
                    > self.confirm_timeout:
                raise LinkClosed(f"no publisher confirm from the peer for "
                                 f"{self.confirm_timeout:.0f} s")

    async def _writer(self, stream) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._out:
                out, self._out = self._out, []
                self._out_bytes = 0
                await stream.send_all(b"".join(out))
                self._check_pressure()

    async def _reader(self, stream, reader: FrameReader, frames: deque) -> None:
        content: dict[int, list] = {}  # channel -> [method, props_raw, size, parts]
        while True:
            while frames:
                ftype, channel, payload = frames.popleft()
                if ftype == FRAME_METHOD:
                    m = spec.decode_method(payload)
                    if m.HAS_CONTENT:
                        content[channel] = [m, b"", 0, []]
                    else:
                        self._method(channel, m)
                elif ftype == FRAME_HEADER:
                    c = content.get(channel)
                    if c is not None:
                        _cls, c[2], c[1] = parse_content_header(payload)
                        if c[2] > _MAX_CONTENT:
                            raise LinkClosed(f"the peer declared a content of {c[2]} bytes")
                        if c[2] == 0:
                            del content[channel]
                            self._content(channel, c[0], c[1], b"")
                elif ftype == FRAME_BODY:
                    c = content.get(channel)
                    if c is not None:
                        c[3].append(payload)
                        c[2] -= len(payload)
                        if c[2] <= 0:
                            del content[channel]
                            self._content(channel, c[0], c[1], b"".join(c[3]))
                elif ftype == FRAME_HEARTBEAT:
                    pass
            data = await stream.receive_some(65536)
            if not data:
                raise LinkClosed("connection closed by the peer")
            frames.extend(reader.feed(data))

    def _method(self, channel: int, m: spec.Method) -> None:
        if channel == 0:
            if isinstance(m, spec.Connection.Close):
                self.send(method_frame(0, spec.Connection.CloseOk()))
                raise LinkClosed(f"closed by the peer: {m.reply_code} {m.reply_text}")
            if isinstance(m, spec.Connection.Blocked):
                self.blocked = True
                self._check_pressure()
            elif isinstance(m, spec.Connection.Unblocked):
                self.blocked = False
                self._check_pressure()
            return
        if isinstance(m, spec.Channel.Close):
            self.send(method_frame(channel, spec.Channel.CloseOk()))
            self._channel_lost(channel, f"{m.reply_code} {m.reply_text}")
            return
        if isinstance(m, spec.Channel.CloseOk):
            self.closing.discard(channel)
            return
        if channel == _PUBLISH:
            if isinstance(m, (spec.Basic.Ack, spec.Basic.Nack)):
                self._decided(m.delivery_tag, m.multiple, isinstance(m, spec.Basic.Ack))
            return
        rc = self.consumers.get(channel)
        if rc is not None and isinstance(m, spec.Basic.Cancel):
            # the master cancelled it (queue deleted there): the local consumer is told
            self.consumers.pop(channel, None)
            rc.channel = 0
            rc.cancelled = True
            self.send(method_frame(channel, spec.Channel.Close(200, "cancelled", 0, 0)))
            self.closing.add(channel)
            rc.target.remote_cancelled("the queue's master cancelled the consumer")

    def _decided(self, tag: int, multiple: bool, ok: bool) -> None:
        pending = self._pending
        if multiple:
            while pending:
                seq = next(iter(pending))
                if seq > tag:
                    break
                pending.pop(seq)[0](ok)
                self.confirmed += ok
        else:
            item = pending.pop(tag, None)
            if item is not None:
                item[0](ok)
                self.confirmed += ok
        self._check_pressure()

    def _channel_lost(self, channel: int, reason: str) -> None:
        if channel == _CONTROL:
            log.warning("link to node %r: a definition was refused by the master: %s",
                        self.node, reason)
            self._control.clear()  # the refused one is among them; what is left is re-sent
            self.send(method_frame(_CONTROL, spec.Channel.Open("")))
        elif channel == _PUBLISH:
            pending, self._pending = self._pending, OrderedDict()
            for done, _t in pending.values():
                done(None)
            log.warning("link to node %r: the publish channel was closed: %s", self.node, reason)
            self._send_many([method_frame(_PUBLISH, spec.Channel.Open("")),
                             method_frame(_PUBLISH, spec.Confirm.Select(False))])
        else:
            rc = self.consumers.pop(channel, None)
            self.closing.discard(channel)
            if rc is not None:
                rc.channel = 0
                rc.cancelled = True
                rc.target.remote_cancelled(f"the master refused the consumer: {reason}")

    def _content(self, channel: int, m: spec.Method, props_raw: bytes, body: bytes) -> None:
        rc = self.consumers.get(channel)
        if rc is None or not isinstance(m, spec.Basic.Deliver):
            return
        rc.target.remote_delivered(m.delivery_tag, m.redelivered, m.exchange, m.routing_key,
                                   props_raw, body)

    def status(self) -> dict:
        return {"node": self.node, "vhost": self.vhost, "connected": self.connected,
                "unconfirmed": len(self._pending), "buffered_bytes": self._out_bytes,
                "consumers": len(self.consumers), "forwarded": self.forwarded,
                "confirmed": self.confirmed, "last_error": self.last_error}
