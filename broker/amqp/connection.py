"""Sans-IO server side of an AMQP 0-9-1 connection.

Feed it the bytes read from the socket with ``receive_data``; it returns events
for the broker and queues the bytes to write, which ``data_to_send`` hands out.
It owns the handshake, channel life cycle, content assembly and the closing
handshakes; it knows nothing of sockets, clocks or queues.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from . import spec
from .codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FrameError,
    FrameReader,
    HEARTBEAT_FRAME,
    erlang_binary,
    method_frame,
    parse_content_header,
    parse_publish,
)
from .fields import FieldError, decode_properties
from .spec import UnknownMethod, MethodDecodeError

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
MAX_MESSAGE_SIZE = 128 * 1024 * 1024


class State(enum.Enum):
    AWAIT_HEADER = "await_header"
    AWAIT_START_OK = "await_start_ok"
    AWAIT_TUNE_OK = "await_tune_ok"
    AWAIT_OPEN = "await_open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close, waiting for close-ok
    CLOSED = "closed"  # nothing more will be read; the edge closes the socket


# ---- events -----------------------------------------------------------------

@dataclass(slots=True)
class ConnectionOpened:
    vhost: str
    username: str
    client_properties: dict


@dataclass(slots=True)
class ChannelOpened:
    channel: int


@dataclass(slots=True)
class ChannelClosedByPeer:
    """The client closed a channel. Write what is still owed on it (publisher confirms), then
    answer with ``accept_channel_close``: nothing may follow a channel's close-ok."""
    channel: int
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class MethodReceived:
    channel: int
    method: spec.Method


@dataclass(slots=True)
class ContentReceived:
    """A complete basic.publish: method arguments, raw properties and body."""
    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    props_raw: bytes
    properties: dict
    body: bytes


@dataclass(slots=True)
class ConnectionClosedByPeer:
    """The client closed the connection; nothing more is read. Write what is owed, then
    answer with ``accept_close``."""
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class ConnectionCloseCompleted:
    """Our connection.close was answered, or the connection must now be dropped."""


@dataclass(slots=True)
class ProtocolError:
    """We closed the connection for a protocol violation (for the log)."""
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class AuthenticationFailed:
    username: str
    reply_text: str


class ChannelException(Exception):
    """Raised by broker logic for a soft error: closes the channel only."""

    def __init__(self, code: int, text: str, method: spec.Method | None = None):
        super().__init__(code, text)
        self.code = code
        self.text = text
        self.class_id = method.CLASS_ID if method is not None else 0
        self.method_id = method.METHOD_ID if method is not None else 0


class ConnectionException(ChannelException):
    """Raised for a hard error: closes the whole connection."""


def error_text(code: int, detail: str) -> str:
    return f"{spec.REPLY_NAMES[code]} - {detail}"


def _reply_text(text: str) -> str:
    """``text`` cut to fit a shortstr: 255 octets (not characters) of valid UTF-8."""
    return text.encode("utf-8", "surrogateescape")[:255].decode("utf-8", "ignore")


# ---- per channel --------------------------------------------------------------

_CH_OPEN = 1
# While closing, only close / close-ok are looked at (everything else is discarded unparsed).
_CONNECTION_CLOSE_IDS = (b"\x00\x0a\x00\x32", b"\x00\x0a\x00\x33")
_CHANNEL_CLOSE_IDS = (b"\x00\x14\x00\x28", b"\x00\x14\x00\x29")
_CH_CLOSING = 2  # we sent channel.close, waiting for close-ok


class _ChannelState:
    __slots__ = ("state", "pending", "props_raw", "properties", "body_size", "body_parts", "received")

    def __init__(self):
        self.state = _CH_OPEN
        self.pending = None  # basic.publish args awaiting content
        self.props_raw = None
        self.properties = None
        self.body_size = 0
        self.body_parts = []
        self.received = 0


Authenticator = Callable[[str, bytes], "tuple[str | None, str]"]


class ServerConnection:
    def __init__(self, authenticate: Authenticator, vhost_exists: Callable[[str], bool],
                 server_properties: dict | None = None, frame_max: int = DEFAULT_FRAME_MAX,
                 channel_max: int = DEFAULT_CHANNEL_MAX, heartbeat: int = DEFAULT_HEARTBEAT,
                 max_message_size: int = MAX_MESSAGE_SIZE):
        self.state = State.AWAIT_HEADER
        self._authenticate = authenticate
        self._vhost_exists = vhost_exists
        props = {"product": "TrioMQ", "version": "0.1.0", "platform": "Python/trio",
                 "copyright": "TrioMQ developers", "information": "AMQP 0-9-1 broker",
                 "cluster_name": "triomq"}
        props.update(server_properties or {})
        props["capabilities"] = dict(SERVER_CAPABILITIES)
        self.server_properties = props
        self.server_frame_max = frame_max
        self.server_channel_max = channel_max
        self.server_heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = 0
        self.vhost = None
        self.username = None
        self.client_properties: dict = {}
        self.client_capabilities: dict = {}
        self._reader = FrameReader(frame_max=frame_max)
        self._header_buf = b""
        self._out: list = []
        self._out_size = 0
        self.channels: dict[int, _ChannelState] = {}
        # True once a closing handshake completed (either side's close answered), as opposed
        # to a stream dropped for a framing error: only then may the edge linger for the EOF.
        self.closed_by_handshake = False

    # ---- output ----
    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return data

    @property
    def pending_output(self) -> int:
        return self._out_size

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)

    def write_many(self, parts: list, size: int) -> None:
        self._out.extend(parts)
        self._out_size += size

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.write(method_frame(channel, method))

    def send_heartbeat(self) -> None:
        self.write(HEARTBEAT_FRAME)

    @property
    def has_output(self) -> bool:
        """Frames are waiting to be written (an empty body still makes frames)."""
        return bool(self._out)

    def accept_channel_close(self, channel: int) -> None:
        """Answer a peer's channel.close (after ``ChannelClosedByPeer``)."""
        self.send_method(channel, spec.Channel.CloseOk())

    def accept_close(self) -> None:
        """Answer a peer's connection.close (after ``ConnectionClosedByPeer``)."""
        self.send_method(0, spec.Connection.CloseOk())

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
        self.send_method(0, spec.Connection.Close(code, _reply_text(text), class_id, method_id))
        self.state = State.CLOSING

    def close_channel(self, channel: int, code: int, text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        ch = self.channels.get(channel)
        if ch is None or ch.state != _CH_OPEN:
            return
        ch.state = _CH_CLOSING
        ch.pending = None
        ch.body_parts = []
        self.send_method(channel, spec.Channel.Close(code, _reply_text(text), class_id, method_id))

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
    def receive_data(self, data: bytes) -> list:
        events: list = []
        if self.state is State.CLOSED:
            return events
        if self.state is State.AWAIT_HEADER:
            data = self._receive_header(data, events)
            if not data:
                return events
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            frames = exc.frames  # the complete frames before the violation are still handled
            error = exc
        else:
            error = None
        if frames:
            for ftype, channel, payload in frames:
                if self.state is State.CLOSED:
                    break
                try:
                    self._handle_frame(ftype, channel, payload, events)
                except ConnectionException as exc:
                    self._protocol_error(exc.code, exc.text, exc.class_id, exc.method_id, events)
        if error is not None and self.state is not State.CLOSED:
            # The stream cannot be re-synchronised after a framing error.
            self._protocol_error(spec.FRAME_ERROR, error.text, 0, 0, events)
            self.state = State.CLOSED
            events.append(ConnectionCloseCompleted())
        return events

    def _receive_header(self, data: bytes, events: list) -> bytes:
        buf = self._header_buf + data
        if len(buf) < 8:
            if spec.PROTOCOL_HEADER.startswith(buf):
                self._header_buf = buf
                return b""
        header, rest = buf[:8], buf[8:]
        self._header_buf = b""
        if header != spec.PROTOCOL_HEADER:
            # Spec 4.2.2: answer with the header we support, then close.
            self.write(spec.PROTOCOL_HEADER)
            self.state = State.CLOSED
            events.append(ProtocolError(0, f"bad protocol header {bytes(header)!r}"))
            events.append(ConnectionCloseCompleted())
            return b""
        self.send_method(0, spec.Connection.Start(
            0, 9, self.server_properties, b"AMQPLAIN PLAIN", b"en_US"))
        self.state = State.AWAIT_START_OK
        return rest

    def _protocol_error(self, code, text, class_id, method_id, events):
        events.append(ProtocolError(code, text))
        self.close(code, text, class_id, method_id)

    def _handle_frame(self, ftype: int, channel: int, payload: bytes, events: list) -> None:
        state = self.state
        if ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise ConnectionException(
                    spec.UNEXPECTED_FRAME,
                    f"UNEXPECTED_FRAME - type 8, all octets = {erlang_binary(payload)}")
            return
        if ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise ConnectionException(
                spec.FRAME_ERROR,
                f"FRAME_ERROR - type {ftype}, all octets = {erlang_binary(payload)}: unknown_frame")
        if state is State.CLOSING:
            # Only close / close-ok matter now (spec 4.2.6 / RabbitMQ's closing state).
            if ftype == FRAME_METHOD and channel == 0 and payload[:4] in _CONNECTION_CLOSE_IDS:
                method = self._decode(payload)
                if isinstance(method, spec.Connection.CloseOk):
                    self.state = State.CLOSED
                    self.closed_by_handshake = True
                    events.append(ConnectionCloseCompleted())
                elif isinstance(method, spec.Connection.Close):
                    self.send_method(0, spec.Connection.CloseOk())
                    self.state = State.CLOSED
                    self.closed_by_handshake = True
                    events.append(ConnectionCloseCompleted())
            return
        if state is not State.OPEN:
            self._handshake_frame(ftype, channel, payload, events)
            return
        if channel == 0:
            if ftype != FRAME_METHOD:
                raise ConnectionException(
                    spec.UNEXPECTED_FRAME,
                    f"UNEXPECTED_FRAME - expected method frame, got non method frame on channel 0")
            method = self._decode(payload)
            if method.CLASS_ID != 10:
                raise ConnectionException(
                    spec.CHANNEL_ERROR,
                    "CHANNEL_ERROR - unexpected method in connection state running", method)
            self._connection_method(method, events)
            return
        ch = self.channels.get(channel)
        if ch is None:
            if ftype == FRAME_METHOD:
                method = self._decode(payload)
                if isinstance(method, spec.Channel.Open):
                    if channel > self.channel_max:
                        raise ConnectionException(
                            spec.CHANNEL_ERROR,
                            f"CHANNEL_ERROR - channel number {channel} exceeds negotiated channel_max "
                            f"{self.channel_max}", method)
                    self.channels[channel] = _ChannelState()
                    self.send_method(channel, spec.Channel.OpenOk(b""))
                    events.append(ChannelOpened(channel))
                    return
                raise ConnectionException(
                    spec.CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", method)
            raise ConnectionException(spec.CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'")
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
            raise ConnectionException(
                spec.UNEXPECTED_FRAME,
                "UNEXPECTED_FRAME - expected method frame, got non method frame instead")
        if payload[:4] == b"\x00\x3c\x00\x28":  # basic.publish, the hot path
            try:
                ch.pending = parse_publish(payload)
            except IndexError:
                raise ConnectionException(
                    spec.SYNTAX_ERROR, "SYNTAX_ERROR - malformed basic.publish") from None
            return
        method = self._decode(payload)
        if isinstance(method, spec.Channel.Close):
            del self.channels[channel]
            events.append(ChannelClosedByPeer(channel, method.reply_code, method.reply_text))
            return
        if isinstance(method, spec.Channel.CloseOk):
            return
        if isinstance(method, spec.Channel.Open):
            raise ConnectionException(
                spec.CHANNEL_ERROR, "CHANNEL_ERROR - second 'channel.open' seen", method)
        if method.HAS_CONTENT:  # a content method clients may not send (return/deliver/get-ok)
            raise ConnectionException(
                spec.COMMAND_INVALID, f"COMMAND_INVALID - {method.amqp_name} not allowed from a client",
                method)
        events.append(MethodReceived(channel, method))

    def _content_frame(self, ch: _ChannelState, ftype, channel, payload, events):
        if ch.props_raw is None:
            if ftype != FRAME_HEADER:
                raise ConnectionException(
                    spec.UNEXPECTED_FRAME,
                    "UNEXPECTED_FRAME - expected content header for class 60, got non content "
                    "header frame instead", spec.Basic.Publish())
            try:
                class_id, body_size, props_raw = parse_content_header(payload)
            except Exception:
                raise ConnectionException(
                    spec.FRAME_ERROR, "FRAME_ERROR - malformed content header") from None
            if class_id != 60:
                raise ConnectionException(
                    spec.UNEXPECTED_FRAME,
                    f"UNEXPECTED_FRAME - expected content header for class 60, got one for class "
                    f"{class_id} instead", spec.Basic.Publish())
            try:
                properties = decode_properties(props_raw)
            except FieldError as exc:
                raise ConnectionException(
                    spec.SYNTAX_ERROR, f"SYNTAX_ERROR - malformed content properties: {exc}",
                    spec.Basic.Publish()) from None
            if body_size > self.max_message_size:
                ch.pending = None
                self.close_channel(
                    channel, spec.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - message size {body_size} is larger than configured max "
                    f"size {self.max_message_size}", 60, 40)
                return
            ch.props_raw = props_raw
            ch.properties = properties
            ch.body_size = body_size
            ch.received = 0
            if body_size == 0:
                self._complete(ch, channel, b"", events)
            return
        if ftype != FRAME_BODY:
            raise ConnectionException(
                spec.UNEXPECTED_FRAME,
                "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
                spec.Basic.Publish())
        ch.received += len(payload)
        if ch.received > ch.body_size:
            raise ConnectionException(
                spec.UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - content body of {ch.received} bytes larger than the declared "
                f"{ch.body_size}", spec.Basic.Publish())
        if ch.received == ch.body_size and not ch.body_parts:
            self._complete(ch, channel, payload, events)
            return
        ch.body_parts.append(payload)
        if ch.received == ch.body_size:
            self._complete(ch, channel, b"".join(ch.body_parts), events)

    def _complete(self, ch: _ChannelState, channel: int, body: bytes, events: list):
        exchange, routing_key, mandatory, immediate = ch.pending
        events.append(ContentReceived(channel, exchange, routing_key, mandatory, immediate,
                                      ch.props_raw, ch.properties, body))
        ch.pending = None
        ch.props_raw = None
        ch.body_parts = []

    def _decode(self, payload: bytes) -> spec.Method:
        try:
            return spec.decode_method(payload)
        except UnknownMethod as exc:
            raise ConnectionException(
                spec.COMMAND_INVALID if exc.class_id in spec.CLASS_NAMES else spec.NOT_IMPLEMENTED,
                f"{spec.REPLY_NAMES[spec.COMMAND_INVALID if exc.class_id in spec.CLASS_NAMES else spec.NOT_IMPLEMENTED]}"
                f" - unknown method (class {exc.class_id}, method {exc.method_id})") from None
        except MethodDecodeError as exc:
            err = ConnectionException(
                spec.FRAME_ERROR,
                exc.rabbit_text or f"FRAME_ERROR - cannot decode {erlang_binary(exc.args_raw)}")
            err.class_id, err.method_id = exc.class_id, exc.method_id
            raise err from None

    def _connection_method(self, method: spec.Method, events: list) -> None:
        if isinstance(method, spec.Connection.Close):
            self.state = State.CLOSED
            self.closed_by_handshake = True
            events.append(ConnectionClosedByPeer(method.reply_code, method.reply_text))
            return
        if isinstance(method, spec.Connection.CloseOk):
            self.state = State.CLOSED
            self.closed_by_handshake = True
            events.append(ConnectionCloseCompleted())
            return
        if isinstance(method, (spec.Connection.Blocked, spec.Connection.Unblocked)):
            return
        if isinstance(method, spec.Connection.UpdateSecret):
            self.send_method(0, spec.Connection.UpdateSecretOk())
            return
        raise ConnectionException(
            spec.COMMAND_INVALID, f"COMMAND_INVALID - unexpected {method.amqp_name} on an open connection",
            method)

    # ---- handshake ----
    def _handshake_frame(self, ftype, channel, payload, events):
        if ftype != FRAME_METHOD or channel != 0:
            raise ConnectionException(
                spec.COMMAND_INVALID, "COMMAND_INVALID - connection not open yet")
        method = self._decode(payload)
        state = self.state
        if isinstance(method, spec.Connection.Close):
            self.state = State.CLOSED
            self.closed_by_handshake = True
            events.append(ConnectionClosedByPeer(method.reply_code, method.reply_text))
            return
        if state is State.AWAIT_START_OK and isinstance(method, spec.Connection.StartOk):
            self.client_properties = method.client_properties or {}
            caps = self.client_properties.get("capabilities")
            self.client_capabilities = caps if isinstance(caps, dict) else {}
            username, failure = self._authenticate(method.mechanism, method.response)
            if username is None:
                events.append(AuthenticationFailed("", failure or "malformed response"))
                if failure and self.client_capabilities.get("authentication_failure_close"):
                    self.close(spec.ACCESS_REFUSED, failure)
                else:
                    self.state = State.CLOSED
                    events.append(ConnectionCloseCompleted())
                return
            self.username = username
            self.send_method(0, spec.Connection.Tune(
                self.server_channel_max, self.server_frame_max, self.server_heartbeat))
            self.state = State.AWAIT_TUNE_OK
            return
        if state is State.AWAIT_TUNE_OK and isinstance(method, spec.Connection.TuneOk):
            frame_max = method.frame_max or self.server_frame_max
            if frame_max < spec.FRAME_MIN_SIZE:
                raise ConnectionException(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - frame_max={frame_max} < {spec.FRAME_MIN_SIZE} min size", method)
            if frame_max > self.server_frame_max:
                raise ConnectionException(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - frame_max={frame_max} > {self.server_frame_max} max size", method)
            channel_max = method.channel_max or self.server_channel_max
            if channel_max > self.server_channel_max:
                raise ConnectionException(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - channel_max={channel_max} > {self.server_channel_max} max",
                    method)
            self.frame_max = frame_max
            self.channel_max = channel_max
            self.heartbeat = method.heartbeat
            self._reader.frame_max = frame_max
            self.state = State.AWAIT_OPEN
            return
        if state is State.AWAIT_OPEN and isinstance(method, spec.Connection.Open):
            if not self._vhost_exists(method.virtual_host):
                raise ConnectionException(
                    spec.NOT_ALLOWED,
                    f"NOT_ALLOWED - vhost {method.virtual_host} not found", method)
            self.vhost = method.virtual_host
            self.send_method(0, spec.Connection.OpenOk(""))
            self.state = State.OPEN
            events.append(ConnectionOpened(self.vhost, self.username, self.client_properties))
            return
        raise ConnectionException(
            spec.COMMAND_INVALID,
            f"COMMAND_INVALID - unexpected {method.amqp_name} in state {state.value}", method)
