"""Stream protocol client commands, sans-IO, fields typed by wire type; not their (de)coding.

The Stream protocol's client commands, sans-IO: one dataclass a command, each field
annotated with its wire type, so the field list is the frame layout. Not reading or writing
them (``codec``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, get_type_hints

from . import frames as fr

# Wire types (the annotation's metadata is what codec reads and writes): "props" is a
# [string string] map kept in order as a dict, "opt_props" one that may be absent,
# "offset_spec" (type, value), "versions" [key min max].
U8 = Annotated[int, "u8"]
U16 = Annotated[int, "u16"]
U32 = Annotated[int, "u32"]
U64 = Annotated[int, "u64"]
I64 = Annotated[int, "i64"]
Str = Annotated[str, "str"]
OptStr = Annotated[str | None, "str"]
Bytes = Annotated[bytes | None, "bytes"]
Props = Annotated[dict[str, str], "props"]
OptProps = Annotated[dict[str, str], "opt_props"]
StrArray = Annotated[list[str], ("array", "str")]
OffsetSpec = Annotated[tuple[int, int], "offset_spec"]
UpdateOffsetSpec = Annotated[tuple[int, int], "update_offset_spec"]
Versions = Annotated[list[tuple[int, int, int]], "versions"]


@dataclass
class Command:
    KEY: ClassVar[int] = 0
    FIELDS: ClassVar[tuple] = ()
    version: int = field(default=1, kw_only=True)


def _cmd(key: int):
    """The command's key, and its wire layout read off its fields' annotations."""
    def wrap(cls):
        hints = get_type_hints(cls, include_extras=True)
        cls.KEY = key
        cls.FIELDS = tuple(hints[f.name].__metadata__[0] for f in fields(cls)
                           if hasattr(hints[f.name], "__metadata__"))
        return cls
    return wrap


@_cmd(fr.DECLARE_PUBLISHER)
@dataclass
class DeclarePublisher(Command):
    correlation_id: U32
    publisher_id: U8
    reference: OptStr
    stream: Str


@dataclass
class PublishedMessage:
    publishing_id: int
    data: Any  # bytes/memoryview of one message, or a SubEntry
    filter_value: str | None = None


@dataclass
class SubEntry:
    compression: int
    count: int
    uncompressed_size: int
    data: Any  # the compressed bytes as received


@_cmd(fr.PUBLISH)
@dataclass
class Publish(Command):
    publisher_id: int
    messages: list[PublishedMessage]


@_cmd(fr.QUERY_PUBLISHER_SEQUENCE)
@dataclass
class QueryPublisherSequence(Command):
    correlation_id: U32
    reference: OptStr
    stream: Str


@_cmd(fr.DELETE_PUBLISHER)
@dataclass
class DeletePublisher(Command):
    correlation_id: U32
    publisher_id: U8


@_cmd(fr.SUBSCRIBE)
@dataclass
class Subscribe(Command):
    correlation_id: U32
    subscription_id: U8
    stream: Str
    offset_spec: OffsetSpec
    credit: U16
    properties: OptProps = field(default_factory=dict)


@_cmd(fr.CREDIT)
@dataclass
class Credit(Command):
    subscription_id: U8
    credit: U16


@_cmd(fr.STORE_OFFSET)
@dataclass
class StoreOffset(Command):
    reference: Str
    stream: Str
    offset: U64


@_cmd(fr.QUERY_OFFSET)
@dataclass
class QueryOffset(Command):
    correlation_id: U32
    reference: Str
    stream: Str


@_cmd(fr.UNSUBSCRIBE)
@dataclass
class Unsubscribe(Command):
    correlation_id: U32
    subscription_id: U8


@_cmd(fr.CREATE)
@dataclass
class Create(Command):
    correlation_id: U32
    stream: Str
    arguments: Props


@_cmd(fr.DELETE)
@dataclass
class Delete(Command):
    correlation_id: U32
    stream: Str


@_cmd(fr.METADATA)
@dataclass
class Metadata(Command):
    correlation_id: U32
    streams: StrArray


@_cmd(fr.PEER_PROPERTIES)
@dataclass
class PeerProperties(Command):
    correlation_id: U32
    properties: Props


@_cmd(fr.SASL_HANDSHAKE)
@dataclass
class SaslHandshake(Command):
    correlation_id: U32


@_cmd(fr.SASL_AUTHENTICATE)
@dataclass
class SaslAuthenticate(Command):
    correlation_id: U32
    mechanism: Str
    data: Bytes


@_cmd(fr.TUNE)
@dataclass
class Tune(Command):
    frame_max: U32
    heartbeat: U32


@_cmd(fr.OPEN)
@dataclass
class Open(Command):
    correlation_id: U32
    virtual_host: Str


@_cmd(fr.CLOSE)
@dataclass
class Close(Command):
    correlation_id: U32
    code: U16
    reason: OptStr


@_cmd(fr.HEARTBEAT)
@dataclass
class Heartbeat(Command):
    pass


@_cmd(fr.ROUTE)
@dataclass
class Route(Command):
    correlation_id: U32
    routing_key: Str
    super_stream: Str


@_cmd(fr.PARTITIONS)
@dataclass
class Partitions(Command):
    correlation_id: U32
    super_stream: Str


@_cmd(fr.EXCHANGE_COMMAND_VERSIONS)
@dataclass
class ExchangeCommandVersions(Command):
    correlation_id: U32
    versions: Versions


@_cmd(fr.STREAM_STATS)
@dataclass
class StreamStats(Command):
    correlation_id: U32
    stream: Str


@_cmd(fr.CREATE_SUPER_STREAM)
@dataclass
class CreateSuperStream(Command):
    correlation_id: U32
    name: Str
    partitions: StrArray
    binding_keys: StrArray
    arguments: Props


@_cmd(fr.DELETE_SUPER_STREAM)
@dataclass
class DeleteSuperStream(Command):
    correlation_id: U32
    name: Str


# the two responses a client sends: to the server's Close and to its ConsumerUpdate
@_cmd(fr.CLOSE | fr.RESPONSE)
@dataclass
class CloseResponse(Command):
    correlation_id: U32
    code: U16


@_cmd(fr.CONSUMER_UPDATE | fr.RESPONSE)
@dataclass
class ConsumerUpdateResponse(Command):
    correlation_id: U32
    code: U16
    offset_spec: UpdateOffsetSpec


CLIENT_COMMANDS: dict[int, type[Command]] = {
    cls.KEY: cls for cls in (
        DeclarePublisher, Publish, QueryPublisherSequence, DeletePublisher, Subscribe,
        Credit, StoreOffset, QueryOffset, Unsubscribe, Create, Delete, Metadata,
        PeerProperties, SaslHandshake, SaslAuthenticate, Tune, Open, Close, Heartbeat,
        Route, Partitions, ExchangeCommandVersions, StreamStats, CreateSuperStream,
        DeleteSuperStream, CloseResponse, ConsumerUpdateResponse)}

# versions this server reads (and, for Deliver, writes): ExchangeCommandVersions' answer
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {key & 0x7FFF: (1, 1) for key in CLIENT_COMMANDS}
SUPPORTED_VERSIONS[fr.PUBLISH] = (1, 2)
SUPPORTED_VERSIONS[fr.DELIVER] = (1, 2)
SUPPORTED_VERSIONS[fr.PUBLISH_CONFIRM] = SUPPORTED_VERSIONS[fr.PUBLISH_ERROR] = (1, 1)
SUPPORTED_VERSIONS[fr.METADATA_UPDATE] = SUPPORTED_VERSIONS[fr.CONSUMER_UPDATE] = (1, 1)
