"""RabbitMQ 4's HTTP-over-AMQP management node (address ``/management``), the protocol
side, without I/O: a request message (``subject`` the HTTP method, ``to`` the path,
``message-id``, ``reply-to`` ``$me``, an amqp-value body) in, a response message
(``subject`` the status code, ``correlation-id`` the request's id, application property
``http:response`` ``1.1``, an amqp-value body) out, and the paths and binding path
segments as RabbitMQ 4 writes them. What a request does is the broker's
(``listeners/amqp10_mgmt.py``)."""
from __future__ import annotations

import base64
import datetime
import hashlib
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from proton import Described, Message, timestamp

from ..amqp.fields import Timestamp

ADDRESS = "/management"
# the request body is a few small maps: a larger message is no management request
MAX_REQUEST = 64 * 1024


class RequestError(ValueError):
    """An unusable request: answered with ``status`` (and the text) when it can be."""

    def __init__(self, status: str, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


@dataclass
class Request:
    method: str
    segments: list[str]  # the path's segments, still percent-encoded
    query: dict[str, str]
    message_id: object
    body: object  # the amqp-value, decoded (None: no body)


def plain(value):
    """A decoded AMQP value as the broker keeps arguments: str keys, plain ints and
    strings. Raises ``RequestError`` (400) for what an argument cannot be."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    raise RequestError("400", f"unsupported argument value {value!r}")


def parse_request(data: bytes) -> Request:
    """The request in ``data`` (an encoded message). Raises ``RequestError``: 400 with a
    message id to answer to; ``message_id`` None when even that is missing."""
    if len(data) > MAX_REQUEST:
        raise RequestError("400", "request too large")
    m = Message()
    try:
        m.decode(data)
    except Exception as exc:  # proton's MessageException / DataException
        raise RequestError("400", f"the request does not decode: {exc}") from None
    method, path = m.subject, m.address
    if not isinstance(method, str) or not isinstance(path, str):
        raise RequestError("400", "a request needs 'subject' (the method) and 'to' (the path)")
    if m.reply_to != "$me":
        raise RequestError("400", "reply-to must be '$me' (the paired link)")
    parts = urlsplit(path)
    if not parts.path.startswith("/"):
        raise RequestError("400", f"bad path '{path}'")
    body = m.body
    if isinstance(body, Described):
        raise RequestError("400", "unexpected described body")
    return Request(method, parts.path.split("/")[1:],
                   dict(parse_qsl(parts.query, keep_blank_values=True)), m.id, body)


_LONG = (-(1 << 63), (1 << 63) - 1)


def wire(value):
    """``value`` as AMQP 1.0 can encode it: a queue's or binding's arguments come from
    0-9-1 (a decimal, a timestamp) or JSON (an integer of any size), which proton's encoder
    refuses, and a refused answer would end the client's whole connection."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [wire(v) for v in value]
    if value is None or isinstance(value, (bool, str, bytes, float)):
        return value
    if isinstance(value, int):
        if type(value).__module__.startswith("proton"):
            return value  # proton's ulong, uint, timestamp ... (int subclasses)
        if isinstance(value, Timestamp):
            return timestamp(int(value) * 1000)  # 0-9-1's are seconds, AMQP 1.0's ms
        if _LONG[0] <= value <= _LONG[1]:
            return int(value)  # (0-9-1's Long, an int subclass proton does not know)
        return str(value)
    if isinstance(value, datetime.datetime):
        return timestamp(int(value.timestamp() * 1000))
    if isinstance(value, Described):
        return value
    return str(value)  # a Decimal: AMQP 1.0's decimals are IEEE 754-2008, 0-9-1's are not


def encode_response(correlation_id, status: str, body) -> bytes:
    m = Message(subject=status, correlation_id=correlation_id, body=wire(body),
                properties={"http:response": "1.1"}, inferred=False)
    return bytes(m.encode())


def segment(name: str) -> str:
    """A name percent-encoded as RabbitMQ 4's clients put it in a path."""
    return quote(name, safe="")


def name_of(seg: str) -> str:
    return unquote(seg, errors="strict")


def args_hash(arguments: dict) -> str:
    """The ``args=`` part of a binding's path: empty without arguments (the only form
    RabbitMQ 4's clients write), else a short hash of them (RabbitMQ's is Erlang's term
    hash, which only its own server reproduces)."""
    if not arguments:
        return ""
    digest = hashlib.sha256(repr(sorted(arguments.items())).encode()).digest()[:4]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def binding_location(source: str, kind: str, destination: str, key: str,
                     arguments: dict) -> str:
    return (f"/bindings/src={segment(source)};dst{kind[0]}={segment(destination)};"
            f"key={segment(key)};args={args_hash(arguments)}")


_BINDING_SEGMENT = re.compile(r"^src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);"
                              r"key=([0-9A-Za-z\-._~%]*);args=([0-9A-Za-z\-_]*)$")


def parse_binding_segment(seg: str) -> tuple[str, str, str, str, str]:
    """(source, 'exchange' | 'queue', destination, key, args hash) of a binding path
    segment ``src=..;dstq=..;key=..;args=..``. Raises ``RequestError`` (400)."""
    m = _BINDING_SEGMENT.match(seg)
    if m is None:
        raise RequestError("400", f"bad binding path segment '{seg}'")
    src, kind, dst, key, hashed = m.groups()
    try:
        return (name_of(src), "exchange" if kind == "e" else "queue", name_of(dst),
                name_of(key), hashed)
    except UnicodeDecodeError:
        raise RequestError("400", f"bad binding path segment '{seg}'") from None
