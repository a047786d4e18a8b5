"""The sans-IO AMQP 0-9-1 connection's handshake (start-ok, login, tune-ok, open) and
connection-class methods once open; not frames, channels or content (connection.py)."""
from __future__ import annotations

from collections.abc import Callable

from .. import errors
from . import spec
from .codec import FRAME_METHOD, FrameReader
from .events import (
    LOGIN_PENDING,
    AuthenticationFailed,
    Authenticator,
    ConnectionCloseCompleted,
    ConnectionClosedByPeer,
    ConnectionOpened,
    Event,
    LoginNeeded,
    State,
)
from .fields import FieldTable, ReadableBuffer


class Handshake:
    """Mixed into ``ServerConnection``: what the handshake reads and sets of it."""
    state: State
    _authenticate: Authenticator
    _pending_login: tuple[str, bytes] | None
    _vhost_exists: Callable[[str], bool]
    update_secret: Callable[[bytes, str], None] | None
    client_properties: FieldTable
    client_capabilities: FieldTable
    username: str | None
    vhost: str | None
    server_frame_max: int
    server_channel_max: int
    server_heartbeat: int
    frame_max: int
    channel_max: int
    heartbeat: int
    _reader: FrameReader

    def send_method(self, channel: int, method: spec.Method) -> None:
        raise NotImplementedError

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        raise NotImplementedError

    def _decode(self, payload: ReadableBuffer) -> spec.Method:
        raise NotImplementedError

    def _connection_method(self, method: spec.Method, events: list[Event]) -> None:
        if isinstance(method, spec.Connection.Close):
            self.state = State.CLOSED
            events.append(ConnectionClosedByPeer(method.reply_code, method.reply_text))
            return
        if isinstance(method, spec.Connection.CloseOk):
            self.state = State.CLOSED
            events.append(ConnectionCloseCompleted())
            return
        if isinstance(method, (spec.Connection.Blocked, spec.Connection.Unblocked)):
            return
        if isinstance(method, spec.Connection.UpdateSecret):
            if self.update_secret is not None:  # raises (530) to refuse the new secret
                self.update_secret(bytes(method.new_secret), method.reason)
            self.send_method(0, spec.Connection.UpdateSecretOk())
            return
        raise errors.command_invalid(f"unexpected {method.amqp_name} on an open connection", method=method)

    def _login(self, mechanism: str, response: bytes, events: list[Event]) -> None:
        """connection.start-ok's credentials decided: tune, or the refusal."""
        username, failure = self._authenticate(mechanism, response)
        if username is None and failure == LOGIN_PENDING:
            self._pending_login = (mechanism, response)
            self.state = State.AWAIT_LOGIN
            events.append(LoginNeeded())
            return
        if username is None:
            refusal = errors.access_refused(failure) if failure else None
            events.append(AuthenticationFailed("", refusal.text if refusal else "malformed response"))
            if refusal is not None and self.client_capabilities.get("authentication_failure_close"):
                self.close(refusal.code, refusal.text)
            else:
                self.state = State.CLOSED
                events.append(ConnectionCloseCompleted())
            return
        self.username = username
        self.send_method(0, spec.Connection.Tune(
            self.server_channel_max, self.server_frame_max, self.server_heartbeat))
        self.state = State.AWAIT_TUNE_OK

    def resume_login(self) -> list[Event]:
        """The edge's check after ``LoginNeeded`` is done: decide the login again (the
        authenticator now answers) and go on as start-ok would have."""
        events: list[Event] = []
        if self.state is not State.AWAIT_LOGIN or self._pending_login is None:
            return events
        mechanism, response = self._pending_login
        self._pending_login = None
        self.state = State.AWAIT_START_OK
        self._login(mechanism, response, events)
        return events

    # ---- handshake ----
    def _handshake_frame(self, ftype: int, channel: int, payload: ReadableBuffer,
                         events: list[Event]) -> None:
        if ftype != FRAME_METHOD or channel != 0:
            raise errors.command_invalid("connection not open yet")
        method = self._decode(payload)
        state = self.state
        if isinstance(method, spec.Connection.Close):
            self.state = State.CLOSED
            events.append(ConnectionClosedByPeer(method.reply_code, method.reply_text))
            return
        if state is State.AWAIT_START_OK and isinstance(method, spec.Connection.StartOk):
            self.client_properties = method.client_properties or {}
            caps = self.client_properties.get("capabilities")
            self.client_capabilities = caps if isinstance(caps, dict) else {}
            self._login(method.mechanism, method.response, events)
            return
        if state is State.AWAIT_TUNE_OK and isinstance(method, spec.Connection.TuneOk):
            frame_max = method.frame_max or self.server_frame_max
            if frame_max < spec.FRAME_MIN_SIZE:
                raise errors.not_allowed("frame_max=%d < %d min size", frame_max,
                                         spec.FRAME_MIN_SIZE, method=method)
            if frame_max > self.server_frame_max:
                raise errors.not_allowed("frame_max=%d > %d max size", frame_max,
                                         self.server_frame_max, method=method)
            channel_max = method.channel_max or self.server_channel_max
            if channel_max > self.server_channel_max:
                raise errors.not_allowed("channel_max=%d > %d max", channel_max,
                                         self.server_channel_max, method=method)
            self.frame_max = frame_max
            self.channel_max = channel_max
            self.heartbeat = method.heartbeat
            self._reader.frame_max = frame_max
            self.state = State.AWAIT_OPEN
            return
        if state is State.AWAIT_OPEN and isinstance(method, spec.Connection.Open):
            if not self._vhost_exists(method.virtual_host):
                raise errors.not_allowed(f"vhost {method.virtual_host} not found", method=method)
            self.vhost = method.virtual_host
            self.send_method(0, spec.Connection.OpenOk(""))
            self.state = State.OPEN
            assert self.username is not None  # set by start-ok, before tune-ok and open
            events.append(ConnectionOpened(self.vhost, self.username, self.client_properties))
            return
        raise errors.command_invalid(f"unexpected {method.amqp_name} in state {state.value}", method=method)
