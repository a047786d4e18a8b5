"""What the sans-IO AMQP 0-9-1 connection hands its edge: its states, the events
``receive_data`` returns and the authenticator's type; no parsing or state changes here."""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from . import spec
from .fields import FieldTable, Properties


class State(enum.Enum):
    AWAIT_HEADER = "await_header"
    AWAIT_START_OK = "await_start_ok"
    AWAIT_LOGIN = "await_login"  # start-ok received; the edge checks the credentials
    AWAIT_TUNE_OK = "await_tune_ok"
    AWAIT_OPEN = "await_open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close, waiting for close-ok
    CLOSED = "closed"  # nothing more will be read; the edge closes the socket


# ---- events -----------------------------------------------------------------

@dataclass(slots=True)
class ConnectionOpened:
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)
    vhost: str
    username: str
    client_properties: FieldTable


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
class ContentStarted:
    """A basic.publish's content header declared a body of more than one frame: the broker
    may refuse the publish (a channel error) before its body is read."""
    channel: int
    exchange: str
    body_size: int


@dataclass(slots=True)
class ContentReceived:
    """A complete basic.publish: method arguments, raw properties and body."""
    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    props_raw: bytes
    properties: Properties
    body: bytes


@dataclass(slots=True)
class ConnectionClosedByPeer:
    """The client closed the connection; nothing more is read. Write what is owed, then
    answer with ``accept_close``."""
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class ConnectionCloseCompleted:
    """Our connection.close was answered, or the connection must now be dropped."""
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)


@dataclass(slots=True)
class ProtocolError:
    """We closed the connection for a protocol violation (for the log)."""
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class AuthenticationFailed:
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)
    username: str
    reply_text: str


@dataclass(slots=True)
class LoginNeeded:
    """The authenticator answered ``LOGIN_PENDING``: the edge awaits its check (an OAuth 2
    token introspection) and then calls ``resume_login``; nothing is read meanwhile."""
    channel: ClassVar[int] = 0  # the connection's own (a channel error names channel 0)


# What ``receive_data`` returns.
Event: TypeAlias = (ConnectionOpened | ChannelOpened | ChannelClosedByPeer | MethodReceived
                    | ContentStarted | ContentReceived | ConnectionClosedByPeer
                    | ConnectionCloseCompleted | ProtocolError | AuthenticationFailed
                    | LoginNeeded)


# (mechanism, response) -> (username or None if refused, refusal explanation); the
# explanation LOGIN_PENDING: not decided yet (LoginNeeded, then resume_login)
Authenticator: TypeAlias = Callable[[str, bytes], tuple[str | None, str]]
LOGIN_PENDING = "\x00login pending"
