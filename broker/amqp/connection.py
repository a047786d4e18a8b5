"""Sans-IO server side of an AMQP 0-9-1 connection.

Feed it the bytes read from the socket with ``receive_data`` (or receive into
``get_buffer`` and report them with ``buffer_updated``); it returns events for the
broker and queues the bytes to write, which ``data_to_send`` (one joined buffer) or
``buffers_to_send`` (a list for a gathering send) hands out.
It owns the handshake, channel life cycle, content assembly and the closing
handshakes; it knows nothing of sockets, clocks or queues.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, cast

from .. import errors
from ..errors import AMQPError, reply_text
from . import spec
from .codec import (
    FRAME_BODY,
    FRAME_BODY_PART,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    Frame,
    FrameError,
    FrameReader,
    OutPart,
    PublishArgs,
    erlang_binary,
    parse_content_header,
    parse_publish,
)
from .events import (
    Authenticator,
    ChannelClosedByPeer,
    ChannelOpened,
    ConnectionCloseCompleted,
    ContentReceived,
    ContentStarted,
    Event,
    MethodReceived,
    ProtocolError,
    State,
)
from .fields import FieldError, FieldTable, Properties, ReadableBuffer, decode_properties
from .handshake import Handshake
from .output import FrameOutput
from .scatter import CH_OPEN, BodyScatter, _Plan
from .spec import MethodDecodeError, UnknownMethod

SERVER_CAPABILITIES: Final[dict[str, bool]] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
MAX_MESSAGE_SIZE = 128 * 1024 * 1024


_PUBLISH = spec.Basic.Publish()  # names the method of content-frame errors
_PUBLISH_ID = b"\x00\x3c\x00\x28"  # basic.publish's class and method ids
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size
# A body buffer kept for the connection's next large content (see ``_spare``) at most.
_SPARE_MAX = 8 * 1024 * 1024

# ---- per channel --------------------------------------------------------------

_CH_OPEN = CH_OPEN
# While closing, only close / close-ok are looked at (everything else is discarded unparsed).
_CONNECTION_CLOSE_IDS = (b"\x00\x0a\x00\x32", b"\x00\x0a\x00\x33")
_CHANNEL_CLOSE_IDS = (b"\x00\x14\x00\x28", b"\x00\x14\x00\x29")
_CH_CLOSING = 2  # we sent channel.close, waiting for close-ok


class _ChannelState:
    __slots__ = ("body", "body_size", "pending", "properties", "props_raw", "received", "state")

    def __init__(self) -> None:
        self.state = _CH_OPEN
        # While a content is in flight (``pending`` set), ``props_raw`` and ``properties`` are
        # set once its header arrived.
        self.pending: PublishArgs | None = None  # basic.publish args awaiting content
        self.props_raw: bytes | None = None
        self.properties: Properties | None = None
        self.body_size = 0
        # A body that comes in more than one frame is put together here: its first
        # ``received`` octets. The buffer grows with what arrives, at most to twice that
        # (never to the declared size at once: a peer's partial body costs at most twice
        # what it sent); the edge may receive the rest of a frame straight into it.
        self.body: bytearray | None = None
        self.received = 0


class ServerConnection(FrameOutput, Handshake, BodyScatter):
    def __init__(self, authenticate: Authenticator, vhost_exists: Callable[[str], bool],
                 server_properties: FieldTable | None = None, frame_max: int = DEFAULT_FRAME_MAX,
                 channel_max: int = DEFAULT_CHANNEL_MAX, heartbeat: int = DEFAULT_HEARTBEAT,
                 max_message_size: int = MAX_MESSAGE_SIZE,
                 mechanisms: bytes = b"AMQPLAIN PLAIN",
                 max_partial_bodies: int | None = None) -> None:
        self.state = State.AWAIT_HEADER
        self.mechanisms = mechanisms  # offered in connection.start (EXTERNAL on TLS)
        self._authenticate = authenticate
        self._pending_login: tuple[str, bytes] | None = None  # start-ok's, while AWAIT_LOGIN
        # connection.update-secret (RabbitMQ's extension): (new secret, reason), raising an
        # AMQPError to refuse it; None: accepted as is
        self.update_secret: Callable[[bytes, str], None] | None = None
        self._vhost_exists = vhost_exists
        props: FieldTable = {"product": "TrioMQ", "version": "", "platform": "Python/trio",
                 "copyright": "TrioMQ developers", "information": "AMQP 0-9-1 broker",
                 "cluster_name": "triomq"}
        props.update(server_properties or {})
        props["capabilities"] = dict(SERVER_CAPABILITIES)
        self.server_properties = props
        self.server_frame_max = frame_max
        self.server_channel_max = channel_max
        self.server_heartbeat = heartbeat
        self.max_message_size = max_message_size
        # Octets of bodies still being received, over all channels, and their bound (a
        # channel whose content would pass it is closed): what a peer can make the
        # connection hold without completing a message.
        self.partial_bytes = 0
        self.max_partial_bodies = (2 * max_message_size if max_partial_bodies is None
                                   else max_partial_bodies)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = 0
        self.vhost: str | None = None
        self.username: str | None = None
        self.client_properties: FieldTable = {}
        self.client_capabilities: FieldTable = {}
        self._reader = FrameReader(frame_max=frame_max)
        # the edge's limit on the octets of (non-body) frames handled per ``receive_data``
        # call (0: all); ``input_pending`` says when buffered frames are left for later
        self.input_budget = 0
        # the content whose body part the last ``get_buffer`` handed out (else None)
        self._direct: _ChannelState | None = None
        self._plan: _Plan | None = None  # the frames the last get_buffers expected (scatter.py)
        self._receiving = 0
        self._last_read = 0
        # the body buffer of the last large content, reused by the next one (a buffer in use
        # stays warm in the cache and is not allocated again); dropped when input goes idle
        self._spare: bytearray | None = None
        self._out: list[OutPart] = []
        self._out_size = 0
        self._out_gather = False  # _out holds a part of at least GATHER_MIN octets
        # octets and reads / writes through the edge (the management API's recv_oct,
        # recv_cnt, send_oct, send_cnt): counted once per read or write, not per frame
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.channels: dict[int, _ChannelState] = {}
        # True once we answered the peer's connection.close: the peer may still have frames
        # in flight, so the edge reads and drops them until EOF (as RabbitMQ) rather than
        # resetting the connection. Not after the peer's close-ok (its last frame) nor after
        # a framing error (the stream is dropped at once).
        self.linger_for_eof = False

    def accept_channel_close(self, channel: int) -> None:
        """Answer a peer's channel.close (after ``ChannelClosedByPeer``)."""
        self.send_method(channel, spec.Channel.CloseOk())

    def accept_close(self) -> None:
        """Answer a peer's connection.close (after ``ConnectionClosedByPeer``)."""
        self.send_method(0, spec.Connection.CloseOk())
        self.linger_for_eof = True

    @property
    def is_open(self) -> bool:
        return self.state is State.OPEN

    def channel_is_open(self, channel: int) -> bool:
        ch = self.channels.get(channel)
        return ch is not None and ch.state == _CH_OPEN

    # ---- server-initiated closes ----
    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Begin closing the connection (connection.close, then wait for close-ok)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.AWAIT_HEADER:
            self.state = State.CLOSED
            return
        self.send_method(0, spec.Connection.Close(code, reply_text(text), class_id, method_id))
        self.state = State.CLOSING

    def close_channel(self, channel: int, code: int, text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        ch = self.channels.get(channel)
        if ch is None or ch.state != _CH_OPEN:
            return
        ch.state = _CH_CLOSING
        ch.pending = None
        self._drop_body(ch)
        self.send_method(channel, spec.Channel.Close(code, reply_text(text), class_id, method_id))

    def send_blocked(self, reason: str) -> bool:
        if self.state is State.OPEN and self.client_capabilities.get("connection.blocked"):
            self.send_method(0, spec.Connection.Blocked(reason))
            return True
        return False

    def send_unblocked(self) -> bool:
        if self.state is State.OPEN and self.client_capabilities.get("connection.blocked"):
            self.send_method(0, spec.Connection.Unblocked())
            return True
        return False

    # ---- input ----
    def get_buffer(self, size: int) -> memoryview:
        """Where to receive the next octets of the stream (at most ``size``; report them with
        ``buffer_updated``). Inside a large body frame whose start was handled, that is the
        rest of the frame's payload in its content's body (grown for it by at most what
        arrived so far); otherwise the frame buffer."""
        channel, left = self._reader.body_remaining
        if left and self.state is State.OPEN:
            ch = self.channels.get(channel)
            if (ch is not None and ch.body is not None and ch.pending is not None
                    and ch.state == _CH_OPEN and ch.received + left <= ch.body_size):
                body = ch.body
                start = ch.received
                # no more than doubles what arrived (the buffer grows by received octets)
                end = start + min(left, size, max(len(body) - start, start))
                if end <= len(body) or \
                        self.partial_bytes + end - len(body) <= self.max_partial_bodies:
                    if end > len(body):
                        body = self._grow(ch, end, exact=True)
                    self._direct = ch
                    return memoryview(body)[start:end]
        self._direct = None
        return self._reader.get_buffer(size)

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` octets were received into the last ``get_buffer``; ``receive_data()``
        handles them."""
        self.recv_oct += nbytes
        self.recv_cnt += 1
        plan = self._plan
        if plan is not None:
            self._plan = None
            self._last_read = nbytes
            self._scatter_updated(plan, nbytes)
            return
        ch = self._direct
        if ch is not None:
            self._direct = None
            self._reader.body_received(nbytes)
            if ch.body is not None:  # (not dropped meanwhile: its channel closed)
                ch.received += nbytes
        else:
            self._reader.buffer_updated(nbytes)
            self._last_read = nbytes

    @property
    def input_pending(self) -> bool:
        """Frames are buffered that the last ``receive_data`` left for later (its budget)."""
        return self._reader.stopped and self.state is not State.CLOSED

    def receive_data(self, data: ReadableBuffer = b"") -> list[Event]:
        """Add ``data`` to what was received and handle the buffered frames, at most
        ``input_budget`` octets of them besides body frames (``input_pending``: more left)."""
        events: list[Event] = []
        # (a local, so that the type checker does not take self.state to stay "not CLOSED":
        # handling a frame changes it)
        state = self.state
        if state is State.CLOSED:
            return events
        reader = self._reader
        if data:
            reader.append(data)
            self._last_read = len(data)
            self.recv_oct += self._last_read
            self.recv_cnt += 1
        if state is State.AWAIT_HEADER and not self._receive_header(events):
            return events
        error: FrameError | None
        try:
            frames = reader.parse(self.input_budget)
        except FrameError as exc:
            frames = exc.frames  # the complete frames before the violation are still handled
            error = exc
        else:
            error = None
        if frames:
            i, count = 0, len(frames)
            while i < count:
                ftype, channel, payload = frames[i]
                if self.state is State.CLOSED:
                    break
                if ftype == FRAME_METHOD and i + 2 < count and payload[:4] == _PUBLISH_ID \
                        and self._whole_publish(channel, payload, frames[i + 1], frames[i + 2],
                                                events):
                    i += 3
                    continue
                i += 1
                try:
                    self._handle_frame(ftype, channel, payload, events)
                except AMQPError as exc:
                    self._protocol_error(exc.code, exc.text, exc.class_id, exc.method_id, events)
        if error is not None and self.state is not State.CLOSED:
            # The stream cannot be re-synchronised after a framing error.
            err = errors.frame_error(error.explanation)
            self._protocol_error(err.code, err.text, 0, 0, events)
            self.state = State.CLOSED
            events.append(ConnectionCloseCompleted())
        if reader.release_if_idle(self._last_read):
            self._spare = None
        return events

    def _grow(self, ch: _ChannelState, need: int, exact: bool = False) -> bytearray:
        """``ch.body`` with room for ``need`` octets: the spare buffer for a first part if it
        fits, else a new buffer (the received octets copied) of ``need`` octets if
        ``exact``, else of up to twice that (amortized growth)."""
        body = ch.body
        size = ch.body_size
        cap = len(body) if body is not None else 0
        spare = self._spare
        if body is None and spare is not None and size <= len(spare) <= 2 * size:
            self._spare = None
            new = spare
        else:
            new = bytearray(min(size, need if exact else max(need, 2 * cap)))
            if ch.received:
                new[:ch.received] = memoryview(body)[:ch.received]  # type: ignore[arg-type]
        self.partial_bytes += len(new) - cap
        ch.body = new
        return new

    def release_input(self) -> None:
        """The connection ended: drop the bodies still being received, the spare and the
        frame buffer, so that their memory goes back at once (not when the session is
        collected)."""
        for ch in self.channels.values():
            self._drop_body(ch)
        self._reader.release_if_idle(0)
        self._direct = None
        self._spare = None

    def _drop_body(self, ch: _ChannelState) -> None:
        if ch.body is not None:
            self.partial_bytes -= len(ch.body)
            ch.body = None

    def _whole_publish(self, channel: int, method: bytes | memoryview, header: Frame,
                       body: Frame, events: list[Event]) -> bool:
        """A basic.publish whose header and single body frame were read with it, on an open
        channel with no content in flight: one ``ContentReceived`` at once, instead of three
        trips through ``_handle_frame``. False, having changed nothing, for anything else
        (another frame in between, an empty or multi-frame body, any fault): the frame-by-frame
        path then handles the three frames and gives every error exactly as before."""
        htype, hchannel, hpayload = header
        btype, bchannel, bpayload = body
        if htype != FRAME_HEADER or btype != FRAME_BODY or hchannel != channel \
                or bchannel != channel or self.state is not State.OPEN or not channel:
            return False
        ch = self.channels.get(channel)
        if ch is None or ch.state != _CH_OPEN or ch.pending is not None or len(hpayload) < 14:
            return False
        class_id, _weight, body_size = _CONTENT_HEADER.unpack_from(hpayload, 0)
        if class_id != 60 or body_size != len(bpayload) or not body_size \
                or body_size > self.max_message_size:
            return False
        props_raw = hpayload[12:]  # header and method frames arrive as bytes
        try:
            exchange, routing_key, mandatory, immediate = parse_publish(method)  # type: ignore[arg-type]
            properties = decode_properties(props_raw)
        except (IndexError, FieldError):
            return False
        events.append(ContentReceived(channel, exchange, routing_key, mandatory, immediate,
                                      props_raw, properties,  # type: ignore[arg-type]
                                      bpayload if type(bpayload) is bytes else bytes(bpayload)))
        return True

    def _receive_header(self, events: list[Event]) -> bool:
        """The protocol header, from the frame buffer: True once it was accepted."""
        header = self._reader.peek(8)
        if len(header) < 8 and spec.PROTOCOL_HEADER.startswith(header):
            return False
        self._reader.skip(len(header))
        if header != spec.PROTOCOL_HEADER:
            # Spec 4.2.2: answer with the header we support, then close.
            self.write(spec.PROTOCOL_HEADER)
            self.state = State.CLOSED
            events.append(ProtocolError(0, f"bad protocol header {header!r}"))
            events.append(ConnectionCloseCompleted())
            return False
        self.send_method(0, spec.Connection.Start(
            0, 9, self.server_properties, self.mechanisms, b"en_US"))
        self.state = State.AWAIT_START_OK
        return True

    def _protocol_error(self, code: int, text: str, class_id: int, method_id: int,
                        events: list[Event]) -> None:
        events.append(ProtocolError(code, text))
        self.close(code, text, class_id, method_id)

    def _handle_frame(self, ftype: int, channel: int, payload: bytes | memoryview,
                      events: list[Event]) -> None:
        state = self.state
        if ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise errors.unexpected_frame(f"type 8, all octets = {erlang_binary(payload)}")
            return
        if ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_BODY_PART):
            raise errors.frame_error(f"type {ftype}, all octets = {erlang_binary(payload)}: unknown_frame")
        if state is State.CLOSING:
            # Only close / close-ok matter now (spec 4.2.6 / RabbitMQ's closing state).
            if ftype == FRAME_METHOD and channel == 0 and payload[:4] in _CONNECTION_CLOSE_IDS:
                method = self._decode(payload)
                if isinstance(method, spec.Connection.CloseOk):
                    self.state = State.CLOSED
                    events.append(ConnectionCloseCompleted())
                elif isinstance(method, spec.Connection.Close):
                    self.send_method(0, spec.Connection.CloseOk())
                    self.state = State.CLOSED
                    self.linger_for_eof = True
                    events.append(ConnectionCloseCompleted())
            return
        if state is not State.OPEN:
            self._handshake_frame(ftype, channel, payload, events)
            return
        if channel == 0:
            if ftype != FRAME_METHOD:
                raise errors.unexpected_frame("expected method frame, got non method frame on channel 0")
            method = self._decode(payload)
            if method.CLASS_ID != 10:
                raise errors.channel_error("unexpected method in connection state running", method=method)
            self._connection_method(method, events)
            return
        ch = self.channels.get(channel)
        if ch is None:
            if ftype == FRAME_METHOD:
                method = self._decode(payload)
                if isinstance(method, spec.Channel.Open):
                    if channel > self.channel_max:
                        raise errors.channel_error(f"channel number {channel} exceeds negotiated channel_max "
                            f"{self.channel_max}", method=method)
                    self.channels[channel] = _ChannelState()
                    self.send_method(channel, spec.Channel.OpenOk(b""))
                    events.append(ChannelOpened(channel))
                    return
                raise errors.channel_error("expected 'channel.open'", method=method)
            raise errors.channel_error("expected 'channel.open'")
        if ch.state == _CH_CLOSING:
            if ftype == FRAME_METHOD and payload[:4] in _CHANNEL_CLOSE_IDS:
                method = self._decode(payload)
                if isinstance(method, spec.Channel.CloseOk):
                    del self.channels[channel]
                elif isinstance(method, spec.Channel.Close):
                    self.send_method(channel, spec.Channel.CloseOk())
                    del self.channels[channel]
            return
        if ch.pending is not None:
            self._content_frame(ch, ftype, channel, payload, events)
            return
        if ftype != FRAME_METHOD:
            raise errors.unexpected_frame("expected method frame, got non method frame instead")
        if payload[:4] == _PUBLISH_ID:  # basic.publish, the hot path
            try:
                ch.pending = parse_publish(cast(bytes, payload))  # a method frame: bytes
            except IndexError:
                raise errors.syntax_error("malformed basic.publish") from None
            return
        method = self._decode(payload)
        if isinstance(method, spec.Channel.Close):
            del self.channels[channel]
            events.append(ChannelClosedByPeer(channel, method.reply_code, method.reply_text))
            return
        if isinstance(method, spec.Channel.CloseOk):
            return
        if isinstance(method, spec.Channel.Open):
            raise errors.channel_error("second 'channel.open' seen", method=method)
        if method.HAS_CONTENT:  # a content method clients may not send (return/deliver/get-ok)
            raise errors.command_invalid(f"{method.amqp_name} not allowed from a client", method=method)
        events.append(MethodReceived(channel, method))

    def _content_frame(self, ch: _ChannelState, ftype: int, channel: int,
                       payload: bytes | memoryview, events: list[Event]) -> None:
        if ch.props_raw is None:
            if ftype != FRAME_HEADER:
                raise errors.unexpected_frame("expected content header for class 60, got non content "
                    "header frame instead", method=_PUBLISH)
            try:
                class_id, body_size, props_raw = parse_content_header(cast(bytes, payload))
            except Exception:
                raise errors.frame_error("malformed content header") from None
            if class_id != 60:
                raise errors.unexpected_frame(f"expected content header for class 60, got one for class "
                    f"{class_id} instead", method=_PUBLISH)
            try:
                properties = decode_properties(props_raw)
            except FieldError as exc:
                raise errors.syntax_error("malformed content properties: %s", exc,
                                          method=_PUBLISH) from None
            if body_size > self.max_message_size:
                ch.pending = None
                err = errors.precondition_failed(
                    "message size %d is larger than configured max size %d", body_size,
                    self.max_message_size, method=_PUBLISH)
                self.close_channel(channel, err.code, err.text, err.class_id, err.method_id)
                return
            ch.props_raw = props_raw
            ch.properties = properties
            ch.body_size = body_size
            ch.received = 0
            if body_size == 0:
                self._complete(ch, channel, b"", events)
            elif body_size > self.frame_max - 8:
                # more than one frame: the broker may refuse it before reading the body
                self._receiving = channel
                events.append(ContentStarted(channel, ch.pending[0], body_size))  # type: ignore[index]
            return
        if ftype != FRAME_BODY and ftype != FRAME_BODY_PART:
            raise errors.unexpected_frame(
                "expected content body, got non content body frame instead", method=_PUBLISH)
        received = ch.received + len(payload)
        if received > ch.body_size:
            raise errors.unexpected_frame(f"content body of {received} bytes larger than the declared "
                f"{ch.body_size}", method=_PUBLISH)
        body = ch.body
        if body is None and received == ch.body_size and ftype == FRAME_BODY:
            # the whole body in one frame
            ch.received = received
            self._complete(ch, channel, payload if type(payload) is bytes else bytes(payload),
                           events)
            return
        if body is None or received > len(body):
            body = self._grow(ch, received)
            if self.partial_bytes > self.max_partial_bodies:
                err = errors.precondition_failed(
                    "message bodies being received on this connection exceed the limit of %d "
                    "bytes", self.max_partial_bodies, method=_PUBLISH)
                self.close_channel(channel, err.code, err.text, err.class_id, err.method_id)
                return
        body[ch.received:received] = payload
        ch.received = received
        if received == ch.body_size and ftype == FRAME_BODY:
            self._complete(ch, channel, bytes(memoryview(body)[:received]), events)
            self.partial_bytes -= len(body)
            if len(body) <= _SPARE_MAX:
                self._spare = body

    def _complete(self, ch: _ChannelState, channel: int, body: bytes, events: list[Event]) -> None:
        # Called with the content's header received: pending, props_raw and properties are set
        # (not checked here, the publish hot path).
        exchange, routing_key, mandatory, immediate = ch.pending  # type: ignore[misc]
        events.append(ContentReceived(channel, exchange, routing_key, mandatory, immediate,
                                      ch.props_raw, ch.properties, body))  # type: ignore[arg-type]
        ch.pending = None
        ch.props_raw = None
        ch.body = None

    def _decode(self, payload: ReadableBuffer) -> spec.Method:
        try:
            return spec.decode_method(payload)
        except UnknownMethod as exc:
            name = "command_invalid" if exc.class_id in spec.CLASS_NAMES else "not_implemented"
            raise errors.amqp_error(name, "unknown method (class %d, method %d)", exc.class_id,
                                    exc.method_id) from None
        except MethodDecodeError as exc:
            err = errors.frame_error(
                exc.rabbit_explanation or f"cannot decode {erlang_binary(exc.args_raw)}")
            err.class_id, err.method_id = exc.class_id, exc.method_id
            raise err from None

