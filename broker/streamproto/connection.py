"""The server side of one Stream-protocol connection, sans-IO: ``receive_data(bytes)``
returns events, frames to write queue up for ``data_to_send()`` / ``buffers_to_send()``.

The handshake is RabbitMQ's: PeerProperties (answered here), SaslHandshake (answered
here: PLAIN only), SaslAuthenticate (``AuthenticateRequested``, answered by the broker
with ``authenticated`` or ``refuse_login``), then the server's Tune and the client's
(frame_max and heartbeat: the lower non-zero of the two), then Open
(``OpenRequested``: ``open_ok`` or ``refuse_open``). Before Open a frame is limited to
``MAX_UNAUTHENTICATED`` bytes; an unexpected frame there ends the connection without a
word, as RabbitMQ 3.10 does. After Open every command is a ``CommandReceived``; a frame
the codec refuses (unknown key or version, wrong size, above frame_max) makes the server
send Close with that code (``unknown frame``, ``frame too large``) and wait for the
client's answer (``CLOSING``), reading nothing else. A client's Close is
``ClosedByPeer``; the broker answers it with ``accept_close``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from . import codec
from .codec import Command, FrameError, FrameReader

# what one frame may be before the login (an anonymous peer cannot make the broker buffer
# more); RabbitMQ's own default frame_max after it
MAX_UNAUTHENTICATED = 65_536
DEFAULT_FRAME_MAX = 1_048_576
DEFAULT_HEARTBEAT = 60
MECHANISMS = ("PLAIN",)


class State(enum.Enum):
    PEER_PROPERTIES = 1  # waiting for PeerProperties
    SASL = 2  # waiting for SaslHandshake / SaslAuthenticate
    AUTHENTICATING = 3  # SaslAuthenticate handed to the broker
    TUNING = 4  # Tune sent, waiting for the client's
    OPENING = 5  # waiting for Open
    OPEN_REQUESTED = 6  # Open handed to the broker
    OPEN = 7
    CLOSING = 8  # the server sent Close; only the client's CloseResponse is read
    CLOSED = 9


@dataclass
class AuthenticateRequested:
    correlation_id: int
    mechanism: str
    username: str
    password: str


@dataclass
class OpenRequested:
    correlation_id: int
    virtual_host: str


@dataclass
class CommandReceived:
    command: Command


@dataclass
class ClosedByPeer:
    correlation_id: int
    code: int
    reason: str | None


@dataclass
class ConnectionClosed:
    """The connection is finished: the edge closes the socket (after writing what is
    queued). ``code``/``reason`` say why, for the log."""
    code: int
    reason: str


def parse_plain(data: bytes | None) -> tuple[str, str] | None:
    """SASL PLAIN's ``authzid NUL authcid NUL password``; None when malformed."""
    if data is None:
        return None
    parts = data.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        return None


class ServerConnection:
    def __init__(self, frame_max: int = DEFAULT_FRAME_MAX, heartbeat: int = DEFAULT_HEARTBEAT,
                 server_properties: dict[str, str] | None = None):
        self.reader = FrameReader(MAX_UNAUTHENTICATED)
        self.state = State.PEER_PROPERTIES
        self.server_frame_max = frame_max
        self.server_heartbeat = heartbeat
        self.frame_max = frame_max  # negotiated (0: none)
        self.heartbeat = heartbeat  # seconds, negotiated (0: none)
        self.client_properties: dict[str, str] = {}
        self.server_properties = server_properties or {"product": "TrioMQ"}
        self.username: str | None = None
        self.virtual_host: str | None = None
        self.command_versions: dict[int, tuple[int, int]] = {}  # the client's, by key
        self._out: list = []
        self.pending_output = 0
        self._close_id = 0
        # octets and reads / writes (the management API's recv_oct, recv_cnt, send_oct,
        # send_cnt): once per read or write, not per frame
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0

    # ---- input ----
    def receive_data(self, data) -> list:
        if self.state is State.CLOSED:
            return []
        self.recv_oct += len(data)
        self.recv_cnt += 1
        events: list = []
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            frames = None
            error = exc
        for key, version, payload in frames or ():
            if self.state is State.CLOSED:
                break
            try:
                cmd = codec.decode(key, version, payload)
            except FrameError as exc:
                self._protocol_error(exc, events)
                continue
            self._handle(cmd, events)
        if frames is None:
            self._protocol_error(error, events)
        return events

    def _protocol_error(self, exc: FrameError, events: list) -> None:
        if self.state is State.OPEN:
            self.close(exc.code, "frame too large" if exc.code == codec.FRAME_TOO_LARGE
                       else "unknown frame")
        elif self.state is not State.CLOSING:
            self._finish(exc.code, exc.reason, events)

    def _finish(self, code: int, reason: str, events: list) -> None:
        if self.state is not State.CLOSED:
            self.state = State.CLOSED
            events.append(ConnectionClosed(code, reason))

    def _handle(self, cmd: Command, events: list) -> None:
        state = self.state
        if state is State.OPEN:
            if isinstance(cmd, codec.Heartbeat):
                return
            if isinstance(cmd, codec.Close):
                events.append(ClosedByPeer(cmd.correlation_id, cmd.code, cmd.reason))
                return
            if isinstance(cmd, codec.ExchangeCommandVersions):
                self.command_versions = {k: (lo, hi) for k, lo, hi in cmd.versions}
                self.send(codec.encode_response(
                    codec.EXCHANGE_COMMAND_VERSIONS, cmd.correlation_id, codec.OK,
                    [(k, lo, hi) for k, (lo, hi) in sorted(codec.SUPPORTED_VERSIONS.items())]))
                return
            if isinstance(cmd, (codec.PeerProperties, codec.SaslHandshake, codec.SaslAuthenticate,
                                codec.Open, codec.Tune)):
                self.close(codec.UNKNOWN_FRAME, "unknown frame")
                return
            events.append(CommandReceived(cmd))
            return
        if state is State.CLOSING:
            if isinstance(cmd, codec.CloseResponse):
                self._finish(codec.OK, "closed", events)
            elif isinstance(cmd, codec.Close):  # both closed at once
                self.send(codec.encode_response(codec.CLOSE, cmd.correlation_id, codec.OK))
                self._finish(cmd.code, cmd.reason or "", events)
            return
        if isinstance(cmd, codec.Heartbeat) and state is not State.PEER_PROPERTIES:
            return
        if isinstance(cmd, codec.Close):
            self.send(codec.encode_response(codec.CLOSE, cmd.correlation_id, codec.OK))
            self._finish(cmd.code, cmd.reason or "", events)
            return
        if state is State.PEER_PROPERTIES and isinstance(cmd, codec.PeerProperties):
            self.client_properties = {k: v for k, v in cmd.properties.items() if k is not None}
            self.send(codec.encode_response(codec.PEER_PROPERTIES, cmd.correlation_id, codec.OK,
                                            self.server_properties))
            self.state = State.SASL
        elif state is State.SASL and isinstance(cmd, codec.SaslHandshake):
            self.send(codec.encode_response(codec.SASL_HANDSHAKE, cmd.correlation_id, codec.OK,
                                            list(MECHANISMS)))
        elif state is State.SASL and isinstance(cmd, codec.SaslAuthenticate):
            if cmd.mechanism not in MECHANISMS:
                self.send(codec.encode_sasl_response(cmd.correlation_id,
                                                     codec.SASL_MECHANISM_NOT_SUPPORTED))
                self._finish(codec.SASL_MECHANISM_NOT_SUPPORTED,
                             f"SASL mechanism {cmd.mechanism!r} not supported", events)
                return
            creds = parse_plain(cmd.data)
            if creds is None:
                self.send(codec.encode_sasl_response(cmd.correlation_id, codec.SASL_ERROR))
                self._finish(codec.SASL_ERROR, "malformed PLAIN response", events)
                return
            self.state = State.AUTHENTICATING
            events.append(AuthenticateRequested(cmd.correlation_id, cmd.mechanism, *creds))
        elif state is State.TUNING and isinstance(cmd, codec.Tune):
            self.frame_max = _lower(self.server_frame_max, cmd.frame_max)
            self.heartbeat = _lower(self.server_heartbeat, cmd.heartbeat)
            self.reader.max_frame = self.frame_max
            self.state = State.OPENING
        elif state is State.OPENING and isinstance(cmd, codec.Open):
            self.state = State.OPEN_REQUESTED
            events.append(OpenRequested(cmd.correlation_id, cmd.virtual_host))
        elif state is State.OPEN_REQUESTED:
            # pipelined behind Open: kept in order for the broker, who answers Open first
            events.append(CommandReceived(cmd))
        else:
            self._finish(codec.UNKNOWN_FRAME,
                         f"unexpected {type(cmd).__name__} in state {state.name}", events)

    # ---- the broker's answers ----
    def authenticated(self, correlation_id: int, username: str) -> None:
        self.username = username
        self.send(codec.encode_sasl_response(correlation_id, codec.OK))
        self.send(codec.encode_tune(self.server_frame_max, self.server_heartbeat))
        self.state = State.TUNING

    def refuse_login(self, correlation_id: int, code: int = codec.AUTHENTICATION_FAILURE) -> None:
        """A refused login: the answer, then the connection ends (the edge closes it)."""
        self.send(codec.encode_sasl_response(correlation_id, code))
        self.state = State.CLOSED

    def open_ok(self, correlation_id: int, virtual_host: str,
                properties: dict[str, str]) -> None:
        self.virtual_host = virtual_host
        self.send(codec.encode_response(codec.OPEN, correlation_id, codec.OK, properties))
        self.state = State.OPEN

    def refuse_open(self, correlation_id: int,
                    code: int = codec.VIRTUAL_HOST_ACCESS_FAILURE) -> None:
        self.send(codec.encode_response(codec.OPEN, correlation_id, code))
        self.state = State.CLOSED

    def accept_close(self, correlation_id: int) -> None:
        self.send(codec.encode_response(codec.CLOSE, correlation_id, codec.OK))
        self.state = State.CLOSED

    def close(self, code: int, reason: str) -> None:
        """The server closes: Close sent, only the client's answer is read from now on."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._close_id += 1
        self.send(codec.encode_close(self._close_id, code, reason))
        self.state = State.CLOSING

    @property
    def deliver_version(self) -> int:
        """2 when the client said it reads Deliver v2 (the committed chunk id)."""
        return 2 if self.command_versions.get(codec.DELIVER, (1, 1))[1] >= 2 else 1

    # ---- output ----
    def send(self, data) -> None:
        if self.state is State.CLOSED:
            return
        self._out.append(data)
        self.pending_output += len(data)

    def send_buffers(self, buffers: list) -> None:
        """Frames given in pieces (a Deliver's header and the chunk as the log holds it)."""
        if self.state is State.CLOSED:
            return
        for b in buffers:
            self._out.append(b)
            self.pending_output += len(b)

    def send_blocked(self, reason: str) -> bool:
        """The Stream protocol cannot tell a client it is blocked (the broker just stops
        reading it)."""
        return False

    def send_unblocked(self) -> bool:
        return False

    def heartbeat_frame(self) -> None:
        if self.state is State.OPEN:
            self.send(codec.encode_heartbeat())

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def buffers_to_send(self) -> list:
        out, self._out = self._out, []
        if out:
            self.send_oct += self.pending_output
            self.send_cnt += 1
        self.pending_output = 0
        return out

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())


def _lower(a: int, b: int) -> int:
    """The lower of two limits where 0 means none."""
    if not a:
        return b
    if not b:
        return a
    return min(a, b)
