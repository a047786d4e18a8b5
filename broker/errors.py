"""AMQP errors as RabbitMQ models them: raised by name with an explanation.

A call site says *what* went wrong (``not_found(Resource("queue", name, vhost))``,
``precondition_failed("inequivalent arg '%s' for %s", arg, resource)``); this
module alone decides the reply code, the ``"NAME - "`` text prefix, the 255-byte
cap of a shortstr and whether the error closes the channel (soft) or the whole
connection (hard), from the AMQP 0-9-1 table of reply codes -- as RabbitMQ's
``rabbit_misc:amqp_error/4`` and ``rabbit_binary_generator:map_exception/3`` do.

An error raised while handling a method on channel 0 always closes the
connection, whatever its kind (the spec has no channel to close).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

__all__ = [
    "AMQPError",
    "Resource",
    "access_refused",
    "amqp_error",
    "channel_error",
    "command_invalid",
    "connection_forced",
    "frame_error",
    "internal_error",
    "not_allowed",
    "not_found",
    "not_implemented",
    "precondition_failed",
    "reply_name",
    "reply_text",
    "resource_error",
    "resource_locked",
    "syntax_error",
    "unexpected_frame",
]

# name -> (reply code, hard). AMQP 0-9-1 section 1.9 "Constants": soft errors close the
# channel, hard errors the connection.
_ERRORS: Final[dict[str, tuple[int, bool]]] = {
    "content_too_large": (311, False),
    "no_route": (312, False),
    "no_consumers": (313, False),
    "connection_forced": (320, True),
    "invalid_path": (402, True),
    "access_refused": (403, False),
    "not_found": (404, False),
    "resource_locked": (405, False),
    "precondition_failed": (406, False),
    "frame_error": (501, True),
    "syntax_error": (502, True),
    "command_invalid": (503, True),
    "channel_error": (504, True),
    "unexpected_frame": (505, True),
    "resource_error": (506, True),
    "not_allowed": (530, True),
    "not_implemented": (540, True),
    "internal_error": (541, True),
}
_NAMES: Final[dict[int, str]] = {code: name.upper() for name, (code, _hard) in _ERRORS.items()}
_NAMES[200] = "OK"

SHORTSTR_MAX: Final = 255


class _Method(Protocol):
    """What an error needs of the failed method (``spec.Method``'s class constants)."""

    @property
    def CLASS_ID(self) -> int: ...

    @property
    def METHOD_ID(self) -> int: ...


class _ErrorFactory(Protocol):
    """The signature of the per-name constructors (``not_allowed(fmt, *args, method=...)``)."""

    def __call__(self, fmt: str, *args: object, method: _Method | None = None) -> AMQPError: ...


def reply_name(code: int) -> str:
    """The spec's name of a reply code (``404`` -> ``"NOT_FOUND"``); ``"UNKNOWN"`` if none."""
    return _NAMES.get(code, "UNKNOWN")


def reply_text(text: str) -> str:
    """``text`` cut to fit a shortstr: 255 octets (not characters) of valid UTF-8."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= SHORTSTR_MAX:
        return text
    return raw[:SHORTSTR_MAX].decode("utf-8", "ignore")


@dataclass(frozen=True, slots=True)
class Resource:
    """A named thing in a virtual host, rendered as RabbitMQ does: ``queue 'x' in vhost '/'``."""
    kind: str  # "queue" | "exchange" | ...
    name: str
    vhost: str

    def __str__(self) -> str:
        return f"{self.kind} '{self.name}' in vhost '{self.vhost}'"


class AMQPError(Exception):
    """An error the broker reports to the client with channel.close or connection.close.

    Attributes, all decided here: ``name`` (``"not_found"``), ``code`` (404), ``hard``
    (closes the connection rather than the channel), ``text`` (``"NOT_FOUND - ..."``, at
    most 255 bytes), and the ``class_id``/``method_id`` of the method that failed (0 when
    unknown; set with ``for_method``).
    """

    __slots__ = ("class_id", "code", "explanation", "hard", "method_id", "name", "text")

    def __init__(self, name: str, explanation: str, method: _Method | None = None):
        try:
            code, hard = _ERRORS[name]
        except KeyError:
            raise ValueError(f"unknown AMQP error name {name!r}") from None
        self.name = name
        self.code = code
        self.hard = hard
        self.explanation = explanation
        self.text = reply_text(f"{_NAMES[code]} - {explanation}")
        self.class_id = method.CLASS_ID if method is not None else 0
        self.method_id = method.METHOD_ID if method is not None else 0
        super().__init__(self.text)

    def for_method(self, method: _Method | None) -> AMQPError:
        """Attribute the error to ``method`` unless it already names one; returns self."""
        if method is not None and not self.class_id:
            self.class_id = method.CLASS_ID
            self.method_id = method.METHOD_ID
        return self

    def __repr__(self) -> str:
        return f"AMQPError({self.code}, {self.text!r})"


def amqp_error(name: str, fmt: str, *args: object, method: _Method | None = None) -> AMQPError:
    """The error ``name`` with the explanation ``fmt % args`` (``fmt`` as is without args)."""
    return AMQPError(name, fmt % args if args else fmt, method)


def _named(name: str) -> _ErrorFactory:
    def make(fmt: str, *args: object, method: _Method | None = None) -> AMQPError:
        return amqp_error(name, fmt, *args, method=method)
    make.__name__ = name
    make.__qualname__ = name
    make.__doc__ = f"A {name} error ({_ERRORS[name][0]}) explained by ``fmt % args``."
    return make


def not_found(resource: Resource, method: _Method | None = None) -> AMQPError:
    """404 for a missing resource: ``NOT_FOUND - no queue 'x' in vhost '/'``."""
    return AMQPError("not_found", f"no {resource}", method)


def resource_locked(resource: Resource, method: _Method | None = None) -> AMQPError:
    """405 for another connection's exclusive queue, with RabbitMQ's explanation."""
    return AMQPError(
        "resource_locked",
        f"cannot obtain exclusive access to locked {resource}. It could be originally declared "
        f"on another connection or the exclusive property value does not match that of the "
        f"original declaration.", method)


precondition_failed = _named("precondition_failed")
access_refused = _named("access_refused")
command_invalid = _named("command_invalid")
channel_error = _named("channel_error")
not_allowed = _named("not_allowed")
not_implemented = _named("not_implemented")
frame_error = _named("frame_error")
syntax_error = _named("syntax_error")
unexpected_frame = _named("unexpected_frame")
resource_error = _named("resource_error")
internal_error = _named("internal_error")
connection_forced = _named("connection_forced")
