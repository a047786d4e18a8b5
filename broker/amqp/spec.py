"""The AMQP 0-9-1 method table and the classes generated from it.

Every method of the spec is declared once here as (class-id, method-id, name,
fields, has-content); encoding and decoding of method payloads is generic and
driven by that table. The hot methods (basic.publish/deliver/ack) also get
hand-written fast paths in ``codec``.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, TypeAlias, TypeVar

from .fields import (
    ReadableBuffer,
    decode_table,
    encode_table,
)

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MIN_SIZE = 4096

# Reply codes (spec section 1.2 plus RabbitMQ's texts).
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    200: "OK",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}
# Codes that are connection-level ("hard") errors in the spec.
HARD_ERRORS = frozenset({320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541})

FieldType: TypeAlias = Literal["octet", "short", "long", "longlong", "timestamp", "shortstr", "longstr",
                              "bit", "table"]
Fields: TypeAlias = tuple[tuple[str, FieldType], ...]

# (class_id, method_id, "Class.Method", [(field, type)], has_content)
_SPEC: Final[list[tuple[int, int, str, list[tuple[str, FieldType]], bool]]] = [
    (10, 10, "Connection.Start", [("version_major", "octet"), ("version_minor", "octet"),
                                  ("server_properties", "table"), ("mechanisms", "longstr"),
                                  ("locales", "longstr")], False),
    (10, 11, "Connection.StartOk", [("client_properties", "table"), ("mechanism", "shortstr"),
                                    ("response", "longstr"), ("locale", "shortstr")], False),
    (10, 20, "Connection.Secure", [("challenge", "longstr")], False),
    (10, 21, "Connection.SecureOk", [("response", "longstr")], False),
    (10, 30, "Connection.Tune", [("channel_max", "short"), ("frame_max", "long"),
                                 ("heartbeat", "short")], False),
    (10, 31, "Connection.TuneOk", [("channel_max", "short"), ("frame_max", "long"),
                                   ("heartbeat", "short")], False),
    (10, 40, "Connection.Open", [("virtual_host", "shortstr"), ("capabilities", "shortstr"),
                                 ("insist", "bit")], False),
    (10, 41, "Connection.OpenOk", [("known_hosts", "shortstr")], False),
    (10, 50, "Connection.Close", [("reply_code", "short"), ("reply_text", "shortstr"),
                                  ("class_id", "short"), ("method_id", "short")], False),
    (10, 51, "Connection.CloseOk", [], False),
    (10, 60, "Connection.Blocked", [("reason", "shortstr")], False),
    (10, 61, "Connection.Unblocked", [], False),
    (10, 70, "Connection.UpdateSecret", [("new_secret", "longstr"), ("reason", "shortstr")], False),
    (10, 71, "Connection.UpdateSecretOk", [], False),
    (20, 10, "Channel.Open", [("out_of_band", "shortstr")], False),
    (20, 11, "Channel.OpenOk", [("channel_id", "longstr")], False),
    (20, 20, "Channel.Flow", [("active", "bit")], False),
    (20, 21, "Channel.FlowOk", [("active", "bit")], False),
    (20, 40, "Channel.Close", [("reply_code", "short"), ("reply_text", "shortstr"),
                               ("class_id", "short"), ("method_id", "short")], False),
    (20, 41, "Channel.CloseOk", [], False),
    (40, 10, "Exchange.Declare", [("ticket", "short"), ("exchange", "shortstr"), ("type", "shortstr"),
                                  ("passive", "bit"), ("durable", "bit"), ("auto_delete", "bit"),
                                  ("internal", "bit"), ("nowait", "bit"), ("arguments", "table")], False),
    (40, 11, "Exchange.DeclareOk", [], False),
    (40, 20, "Exchange.Delete", [("ticket", "short"), ("exchange", "shortstr"),
                                 ("if_unused", "bit"), ("nowait", "bit")], False),
    (40, 21, "Exchange.DeleteOk", [], False),
    (40, 30, "Exchange.Bind", [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
                               ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")],
     False),
    (40, 31, "Exchange.BindOk", [], False),
    (40, 40, "Exchange.Unbind", [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
                                 ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")],
     False),
    (40, 51, "Exchange.UnbindOk", [], False),
    (50, 10, "Queue.Declare", [("ticket", "short"), ("queue", "shortstr"), ("passive", "bit"),
                               ("durable", "bit"), ("exclusive", "bit"), ("auto_delete", "bit"),
                               ("nowait", "bit"), ("arguments", "table")], False),
    (50, 11, "Queue.DeclareOk", [("queue", "shortstr"), ("message_count", "long"),
                                 ("consumer_count", "long")], False),
    (50, 20, "Queue.Bind", [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
                            ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")], False),
    (50, 21, "Queue.BindOk", [], False),
    (50, 30, "Queue.Purge", [("ticket", "short"), ("queue", "shortstr"), ("nowait", "bit")], False),
    (50, 31, "Queue.PurgeOk", [("message_count", "long")], False),
    (50, 40, "Queue.Delete", [("ticket", "short"), ("queue", "shortstr"), ("if_unused", "bit"),
                              ("if_empty", "bit"), ("nowait", "bit")], False),
    (50, 41, "Queue.DeleteOk", [("message_count", "long")], False),
    (50, 50, "Queue.Unbind", [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
                              ("routing_key", "shortstr"), ("arguments", "table")], False),
    (50, 51, "Queue.UnbindOk", [], False),
    (60, 10, "Basic.Qos", [("prefetch_size", "long"), ("prefetch_count", "short"), ("global_", "bit")],
     False),
    (60, 11, "Basic.QosOk", [], False),
    (60, 20, "Basic.Consume", [("ticket", "short"), ("queue", "shortstr"), ("consumer_tag", "shortstr"),
                               ("no_local", "bit"), ("no_ack", "bit"), ("exclusive", "bit"),
                               ("nowait", "bit"), ("arguments", "table")], False),
    (60, 21, "Basic.ConsumeOk", [("consumer_tag", "shortstr")], False),
    (60, 30, "Basic.Cancel", [("consumer_tag", "shortstr"), ("nowait", "bit")], False),
    (60, 31, "Basic.CancelOk", [("consumer_tag", "shortstr")], False),
    (60, 40, "Basic.Publish", [("ticket", "short"), ("exchange", "shortstr"), ("routing_key", "shortstr"),
                               ("mandatory", "bit"), ("immediate", "bit")], True),
    (60, 50, "Basic.Return", [("reply_code", "short"), ("reply_text", "shortstr"),
                              ("exchange", "shortstr"), ("routing_key", "shortstr")], True),
    (60, 60, "Basic.Deliver", [("consumer_tag", "shortstr"), ("delivery_tag", "longlong"),
                               ("redelivered", "bit"), ("exchange", "shortstr"),
                               ("routing_key", "shortstr")], True),
    (60, 70, "Basic.Get", [("ticket", "short"), ("queue", "shortstr"), ("no_ack", "bit")], False),
    (60, 71, "Basic.GetOk", [("delivery_tag", "longlong"), ("redelivered", "bit"), ("exchange", "shortstr"),
                             ("routing_key", "shortstr"), ("message_count", "long")], True),
    (60, 72, "Basic.GetEmpty", [("cluster_id", "shortstr")], False),
    (60, 80, "Basic.Ack", [("delivery_tag", "longlong"), ("multiple", "bit")], False),
    (60, 90, "Basic.Reject", [("delivery_tag", "longlong"), ("requeue", "bit")], False),
    (60, 100, "Basic.RecoverAsync", [("requeue", "bit")], False),
    (60, 110, "Basic.Recover", [("requeue", "bit")], False),
    (60, 111, "Basic.RecoverOk", [], False),
    (60, 120, "Basic.Nack", [("delivery_tag", "longlong"), ("multiple", "bit"), ("requeue", "bit")], False),
    (90, 10, "Tx.Select", [], False),
    (90, 11, "Tx.SelectOk", [], False),
    (90, 20, "Tx.Commit", [], False),
    (90, 21, "Tx.CommitOk", [], False),
    (90, 30, "Tx.Rollback", [], False),
    (90, 31, "Tx.RollbackOk", [], False),
    (85, 10, "Confirm.Select", [("nowait", "bit")], False),
    (85, 11, "Confirm.SelectOk", [], False),
]

CLASS_NAMES = {10: "connection", 20: "channel", 40: "exchange", 50: "queue", 60: "basic",
               85: "confirm", 90: "tx"}

_DEFAULTS: Final[dict[FieldType, object]] = {
    "octet": 0, "short": 0, "long": 0, "longlong": 0, "shortstr": "", "longstr": b"",
    "bit": False, "table": None, "timestamp": 0}


class MethodDecodeError(ValueError):
    """A method payload that does not match the spec (RabbitMQ answers 501 FRAME_ERROR)."""

    def __init__(self, text: str, class_id: int = 0, method_id: int = 0, args: bytes = b"",
                 rabbit_explanation: str | None = None):
        super().__init__(text)
        self.class_id = class_id
        self.method_id = method_id
        self.args_raw = args
        self.rabbit_explanation = rabbit_explanation


class MalformedUTF8(ValueError):
    pass


class Method:
    """Base of the generated method classes."""

    __slots__ = ()
    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    FIELDS: ClassVar[Fields] = ()
    HAS_CONTENT: ClassVar[bool] = False

    if TYPE_CHECKING:
        # Fields are set per generated class from its FIELDS (the spec's names and types).
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, *args: object, **kwargs: object) -> None:
        fields = self.FIELDS
        for i, (fname, ftype) in enumerate(fields):
            value: object
            if i < len(args):
                value = args[i]
            elif fname in kwargs:
                value = kwargs.pop(fname)
            else:
                value = _DEFAULTS[ftype]
                if ftype == "table":
                    value = {}
            setattr(self, fname, value)
        if kwargs:
            raise TypeError(f"{self.NAME}: unknown fields {sorted(kwargs)}")

    def __repr__(self) -> str:
        # the fields the spec table names (generic over every method class)
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f, _ in self.FIELDS)
        return f"<{self.NAME}({inner})>"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f, _ in self.FIELDS)

    @property
    def amqp_name(self) -> str:
        """The dotted lower-case name RabbitMQ uses in texts, e.g. 'queue.declare'."""
        cls, meth = self.NAME.split(".")
        return f"{cls.lower()}.{_dash(meth)}"

    def encode(self) -> bytes:
        return _encode_args(self)

    @classmethod
    def decode(cls, payload: ReadableBuffer, offset: int) -> Self:
        return _decode_args(cls, payload, offset)


def _dash(camel: str) -> str:
    out: list[str] = []
    for ch in camel:
        if ch.isupper() and out:
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


_PACK_BYTE = struct.Struct(">B")
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_LONGLONG = struct.Struct(">Q")


def _encode_args(method: Method) -> bytes:
    parts = [struct.pack(">HH", method.CLASS_ID, method.METHOD_ID)]
    bits = 0
    nbits = 0
    for fname, ftype in method.FIELDS:
        value = getattr(method, fname)  # the spec table drives encoding: fields by name
        if ftype == "bit":
            if value:
                bits |= 1 << nbits
            nbits += 1
            continue
        if nbits:
            parts.append(_PACK_BYTE.pack(bits))
            bits = nbits = 0
        if ftype == "shortstr":  # names and keys arrive as surrogate-escaped text
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
            if len(raw) > 255:
                raise ValueError(f"shortstr too long for {fname}")
            parts.append(_PACK_BYTE.pack(len(raw)) + raw)
        elif ftype == "longstr":
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
            parts.append(_LONG.pack(len(raw)) + raw)
        elif ftype == "octet":
            parts.append(_PACK_BYTE.pack(value))
        elif ftype == "short":
            parts.append(_SHORT.pack(value))
        elif ftype == "long":
            parts.append(_LONG.pack(value))
        elif ftype in ("longlong", "timestamp"):
            parts.append(_LONGLONG.pack(value))
        elif ftype == "table":
            parts.append(encode_table(value or {}))
        else:  # pragma: no cover - table is closed
            raise AssertionError(ftype)
    if nbits:
        parts.append(_PACK_BYTE.pack(bits))
    return b"".join(parts)


_M = TypeVar("_M", bound=Method)


def _decode_args(cls: type[_M], payload: ReadableBuffer, offset: int) -> _M:
    obj = cls.__new__(cls)
    bitbyte = 0
    bitpos = 8
    try:
        for fname, ftype in cls.FIELDS:
            if ftype == "bit":
                if bitpos >= 8:
                    bitbyte = payload[offset]
                    offset += 1
                    bitpos = 0
                setattr(obj, fname, bool(bitbyte & (1 << bitpos)))
                bitpos += 1
                continue
            bitpos = 8
            if ftype == "shortstr":
                n = payload[offset]
                end = offset + 1 + n
                if end > len(payload):
                    raise MethodDecodeError("shortstr overruns the frame")
                try:
                    setattr(obj, fname, bytes(payload[offset + 1:end]).decode("utf-8"))
                except UnicodeDecodeError:
                    raise MalformedUTF8() from None
                offset = end
            elif ftype == "longstr":
                (n,) = _LONG.unpack_from(payload, offset)
                end = offset + 4 + n
                if end > len(payload):
                    raise MethodDecodeError("longstr overruns the frame")
                setattr(obj, fname, bytes(payload[offset + 4:end]))
                offset = end
            elif ftype == "octet":
                setattr(obj, fname, payload[offset])
                offset += 1
            elif ftype == "short":
                setattr(obj, fname, _SHORT.unpack_from(payload, offset)[0])
                offset += 2
            elif ftype == "long":
                setattr(obj, fname, _LONG.unpack_from(payload, offset)[0])
                offset += 4
            elif ftype in ("longlong", "timestamp"):
                setattr(obj, fname, _LONGLONG.unpack_from(payload, offset)[0])
                offset += 8
            elif ftype == "table":
                value, offset = decode_table(payload, offset)
                setattr(obj, fname, value)
    except MalformedUTF8:
        raise MethodDecodeError("malformed UTF-8", cls.CLASS_ID, cls.METHOD_ID, bytes(payload[4:]),
                                "Malformed UTF-8 in shortstr") from None
    except (IndexError, struct.error, ValueError, RecursionError) as exc:
        raise MethodDecodeError(f"malformed {cls.NAME}: {exc}", cls.CLASS_ID, cls.METHOD_ID,
                                bytes(payload[4:])) from None
    if offset != len(payload):
        raise MethodDecodeError(f"trailing bytes after {cls.NAME}", cls.CLASS_ID, cls.METHOD_ID,
                                bytes(payload[4:]))
    return obj


METHODS: dict[tuple[int, int], type[Method]] = {}


class _Namespace:
    pass


def _build() -> dict[str, _Namespace]:
    namespaces: dict[str, _Namespace] = {}
    for class_id, method_id, name, fields, has_content in _SPEC:
        cls_name, meth_name = name.split(".")
        klass = type(
            name.replace(".", ""),
            (Method,),
            {
                "__slots__": tuple(f for f, _ in fields),
                "CLASS_ID": class_id,
                "METHOD_ID": method_id,
                "NAME": name,
                "FIELDS": tuple(fields),
                "HAS_CONTENT": has_content,
            },
        )
        METHODS[(class_id, method_id)] = klass
        namespaces.setdefault(cls_name, _Namespace())
        setattr(namespaces[cls_name], meth_name, klass)
    return namespaces


_ns = _build()

if TYPE_CHECKING:
    # The namespaces ``_build`` makes from ``_SPEC`` (Connection.Close, Basic.Publish, ...):
    # generated at run time, so the type checker sees them as Any; a method's fields are
    # reached through ``Method.__getattr__`` (Any) below.
    Connection: Any
    Channel: Any
    Exchange: Any
    Queue: Any
    Basic: Any
    Confirm: Any
    Tx: Any
else:
    Connection = _ns["Connection"]
    Channel = _ns["Channel"]
    Exchange = _ns["Exchange"]
    Queue = _ns["Queue"]
    Basic = _ns["Basic"]
    Tx = _ns["Tx"]
    Confirm = _ns["Confirm"]


def decode_method(payload: ReadableBuffer) -> Method:
    """Decode a method frame payload into a Method instance."""
    if len(payload) < 4:
        raise MethodDecodeError("method frame shorter than 4 octets")
    class_id, method_id = struct.unpack_from(">HH", payload, 0)
    klass = METHODS.get((class_id, method_id))
    if klass is None:
        raise UnknownMethod(class_id, method_id)
    return klass.decode(payload, 4)


class UnknownMethod(Exception):
    def __init__(self, class_id: int, method_id: int):
        super().__init__(class_id, method_id)
        self.class_id = class_id
        self.method_id = method_id
