"""Round trips of every spec method, field tables and basic properties."""
from __future__ import annotations

import datetime
import decimal
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.amqp.codec import (
    FrameReader,
    ack_frame,
    content_frames,
    deliver_frames,
    method_frame,
    nack_frame,
    parse_content_header,
    parse_publish,
    shortstr,
)
from broker.amqp.fields import (
    PROPERTY_FIELDS,
    FieldError,
    Long,
    Timestamp,
    decode_properties,
    decode_table,
    encode_properties,
    encode_table,
    encode_value,
)

from .sansio_helpers import raw_frame

ALL_METHODS = sorted(spec.METHODS.items())
METHOD_IDS = [cls.NAME for _, cls in ALL_METHODS]

RICH_TABLE = {
    "bool": True,
    "false": False,
    "int": -123456,
    "long": Long(2**40),
    "big": 2**62,
    "ts": Timestamp(1_700_000_000),
    "str": b"caf\xc3\xa9",
    "float": 2.5,
    "dec": decimal.Decimal("3.14"),
    "void": None,
    "bytes": bytearray(b"\x00\x01\xff"),
    "nested": {"a": [1, b"x", {"deep": [None, True]}], "empty": {}},
    "array": [1, Long(-5), b"s", [], {}],
    "ünïcode-key": b"v",
}

VALUES = {
    "octet": [0, 7, 255],
    "short": [0, 1, 65535],
    "long": [0, 123456, 2**32 - 1],
    "longlong": [0, 2**40 + 3, 2**64 - 1],
    "shortstr": ["", "amq.topic", "ä" * 127 + "x"],  # the last one is 255 bytes
    "longstr": [b"", b"\x00\xff\xfe binary", b"x" * 70000],
    "table": [{}, {"x-match": b"all", "n": 1}, RICH_TABLE],
    "timestamp": [0, 1_700_000_000],
}


def build(cls, variant: int):
    kwargs = {}
    for i, (name, ftype) in enumerate(cls.FIELDS):
        if ftype == "bit":
            kwargs[name] = [bool((i + variant) % 2), True, False][variant]
        else:
            options = VALUES[ftype]
            kwargs[name] = options[(i + variant) % len(options)]
    return cls(**kwargs)


def frame_and_parse(channel: int, method: spec.Method) -> spec.Method:
    data = method_frame(channel, method)
    frames = FrameReader(frame_max=0).feed(data)
    assert len(frames) == 1
    ftype, ch, payload = frames[0]
    assert (ftype, ch) == (spec.FRAME_METHOD, channel)
    assert struct.unpack(">HH", payload[:4]) == (method.CLASS_ID, method.METHOD_ID)
    return spec.decode_method(payload)


def test_method_table_is_complete():
    # 0-9-1 plus RabbitMQ's extensions (exchange.bind, basic.nack, confirm, blocked, update-secret).
    per_class = {10: 14, 20: 6, 40: 8, 50: 10, 60: 18, 85: 2, 90: 6}
    for class_id, count in per_class.items():
        assert sum(1 for c, _ in spec.METHODS if c == class_id) == count, class_id
    assert len(spec.METHODS) == 64
    for (class_id, method_id), cls in spec.METHODS.items():
        assert (class_id, method_id) == (cls.CLASS_ID, cls.METHOD_ID)
        assert class_id in spec.CLASS_NAMES
        ns = getattr(spec, cls.NAME.split(".")[0])
        assert getattr(ns, cls.NAME.split(".")[1]) is cls
    contents = {cls.NAME for cls in spec.METHODS.values() if cls.HAS_CONTENT}
    assert contents == {"Basic.Publish", "Basic.Return", "Basic.Deliver", "Basic.GetOk"}


@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize("key,cls", ALL_METHODS, ids=METHOD_IDS)
def test_every_method_round_trips(key, cls, variant):
    method = build(cls, variant)
    decoded = frame_and_parse(5, method)
    assert type(decoded) is cls
    assert decoded == method
    for name, ftype in cls.FIELDS:
        got, want = getattr(decoded, name), getattr(method, name)
        assert got == want, name
        if ftype == "bit":
            assert isinstance(got, bool)
    # Encoding is deterministic, and decode(encode(x)) re-encodes to the same bytes.
    assert decoded.encode() == method.encode()


@pytest.mark.parametrize("key,cls", ALL_METHODS, ids=METHOD_IDS)
def test_every_method_defaults_round_trip(key, cls):
    method = cls()
    decoded = frame_and_parse(0, method)
    assert decoded == method
    for name, ftype in cls.FIELDS:
        if ftype == "table":
            assert getattr(decoded, name) == {}


@pytest.mark.parametrize("key,cls", ALL_METHODS, ids=METHOD_IDS)
def test_every_method_rejects_truncation(key, cls):
    payload = build(cls, 0).encode()
    for cut in range(4, len(payload)):
        with pytest.raises(spec.MethodDecodeError):
            spec.decode_method(payload[:cut])


@pytest.mark.parametrize("key,cls", ALL_METHODS, ids=METHOD_IDS)
def test_amqp_name(key, cls):
    name = cls().amqp_name
    assert name == name.lower()
    assert name.split(".")[0] == spec.CLASS_NAMES[cls.CLASS_ID]


def test_amqp_name_examples():
    assert spec.Queue.Declare().amqp_name == "queue.declare"
    assert spec.Basic.GetOk().amqp_name == "basic.get-ok"
    assert spec.Connection.UpdateSecretOk().amqp_name == "connection.update-secret-ok"


def test_bits_pack_into_one_octet():
    m = spec.Exchange.Declare(0, "x", "topic", True, False, True, False, True, {})
    payload = m.encode()
    # class, method, ticket, "x", "topic", one bit octet, empty table
    assert payload == (struct.pack(">HHH", 40, 10, 0) + b"\x01x\x05topic" + bytes([0b10101])
                       + b"\x00\x00\x00\x00")
    nack = spec.Basic.Nack(9, False, True)
    assert nack.encode()[-1] == 0b10


def test_positional_and_keyword_construction():
    assert spec.Basic.Ack(5, True) == spec.Basic.Ack(delivery_tag=5, multiple=True)
    with pytest.raises(TypeError):
        spec.Basic.Ack(nope=1)
    assert spec.Basic.Ack(1) != spec.Basic.Nack(1)
    assert "delivery_tag=5" in repr(spec.Basic.Ack(5))


def test_shortstr_too_long_refused():
    with pytest.raises(ValueError):
        spec.Queue.Declare(queue="q" * 256).encode()


def test_decode_method_errors():
    with pytest.raises(spec.MethodDecodeError):
        spec.decode_method(b"\x00\x0a")
    with pytest.raises(spec.UnknownMethod) as info:
        spec.decode_method(struct.pack(">HH", 60, 999))
    assert (info.value.class_id, info.value.method_id) == (60, 999)
    with pytest.raises(spec.UnknownMethod):
        spec.decode_method(struct.pack(">HH", 77, 10))
    # shortstr length overruns
    with pytest.raises(spec.MethodDecodeError):
        spec.decode_method(struct.pack(">HH", 60, 21) + b"\x09abc")
    # longstr length overruns
    with pytest.raises(spec.MethodDecodeError):
        spec.decode_method(struct.pack(">HHI", 10, 20, 1000) + b"abc")
    # table with an unknown tag
    bad_table = struct.pack(">I", 3) + b"\x01kZ"
    with pytest.raises(spec.MethodDecodeError):
        spec.decode_method(struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + bad_table)


def test_non_utf8_shortstr_is_refused():
    # Like RabbitMQ: a shortstr must be UTF-8 ("Malformed UTF-8 in shortstr").
    payload = struct.pack(">HH", 50, 11) + b"\x03q\xff\xfe" + struct.pack(">II", 1, 2)
    with pytest.raises(spec.MethodDecodeError) as info:
        spec.decode_method(payload)
    assert (info.value.class_id, info.value.method_id) == (50, 11)
    assert "Malformed UTF-8" in info.value.rabbit_explanation


@pytest.mark.parametrize("key,cls", ALL_METHODS, ids=METHOD_IDS)
def test_every_method_rejects_trailing_octets(key, cls):
    payload = build(cls, 1).encode()
    with pytest.raises(spec.MethodDecodeError) as info:
        spec.decode_method(payload + b"\x00")
    assert (info.value.class_id, info.value.method_id) == key
    assert info.value.args_raw == payload[4:] + b"\x00"


# ---- hypothesis round trip of any method with arbitrary field values ----------

_FIELD_STRATEGIES = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1),
    "timestamp": st.integers(0, 2**64 - 1),
    "bit": st.booleans(),
    "shortstr": st.text(max_size=60),
    "longstr": st.binary(max_size=300),
}

_scalar_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2**63, 2**63 - 1),
    st.builds(Long, st.integers(-2**63, 2**63 - 1)),
    st.builds(Timestamp, st.integers(0, 2**64 - 1)),
    st.binary(max_size=20),
    st.builds(bytearray, st.binary(max_size=20)),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3,
                min_value=0, max_value=2_000_000),  # RabbitMQ's mantissa is unsigned
)
_keys = st.text(max_size=12).filter(lambda k: len(k.encode("utf-8", "surrogateescape")) <= 255)
field_values = st.recursive(
    _scalar_values,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(_keys, children, max_size=4)),
    max_leaves=12,
)
tables = st.dictionaries(_keys, field_values, max_size=6)
_FIELD_STRATEGIES["table"] = tables


def _normalise(value):
    """What a value decodes to: str->bytes, tuples->lists; everything else is itself."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    return value


@st.composite
def any_method(draw):
    cls = draw(st.sampled_from([cls for _, cls in ALL_METHODS]))
    kwargs = {name: draw(_FIELD_STRATEGIES[ftype]) for name, ftype in cls.FIELDS}
    return cls(**kwargs)


@settings(max_examples=300, deadline=None)
@given(any_method(), st.integers(0, 65535))
def test_any_method_round_trips(method, channel):
    decoded = frame_and_parse(channel, method)
    assert decoded == method
    assert decoded.encode() == method.encode()


@settings(max_examples=300, deadline=None)
@given(tables)
def test_any_table_round_trips(table):
    raw = encode_table(table)
    decoded, end = decode_table(b"junk" + raw + b"tail", 4)
    assert end == 4 + len(raw)
    assert decoded == _normalise(table)
    assert encode_table(decoded) == raw


# ---- field tables, tag by tag --------------------------------------------------

def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def _entry(key: bytes, tag: bytes, raw: bytes) -> bytes:
    return bytes((len(key),)) + key + tag + raw


TAG_CASES = [
    ("t", b"\x01", True),
    ("t", b"\x00", False),
    ("b", b"\xff", -1),
    ("b", b"\x7f", 127),
    ("B", b"\xff", 255),
    ("s", struct.pack(">h", -2), -2),
    ("u", struct.pack(">H", 65535), 65535),
    ("I", struct.pack(">i", -(2**31)), -(2**31)),
    ("i", struct.pack(">I", 2**32 - 1), 2**32 - 1),
    ("l", struct.pack(">q", -(2**63)), -(2**63)),
    ("L", struct.pack(">q", -1), -1),  # signed, as RabbitMQ 3.10 reads it (checked live)
    ("f", struct.pack(">f", 1.5), 1.5),
    ("d", struct.pack(">d", -0.1), -0.1),
    ("D", b"\x02" + struct.pack(">I", 314), decimal.Decimal("3.14")),
    ("D", b"\x00" + struct.pack(">I", 2**32 - 1), decimal.Decimal(2**32 - 1)),  # unsigned
    ("D", b"\x00" + struct.pack(">i", 7), decimal.Decimal(7)),
    ("S", struct.pack(">I", 4) + b"\x00\xff\xc3\xa9", b"\x00\xff\xc3\xa9"),
    ("S", struct.pack(">I", 0), b""),
    ("A", struct.pack(">I", 7) + b"I" + struct.pack(">i", 9) + b"t\x01", [9, True]),
    ("A", struct.pack(">I", 0), []),
    ("T", struct.pack(">Q", 1_700_000_000), 1_700_000_000),
    ("F", _table(_entry(b"k", b"V", b"")), {"k": None}),
    ("F", _table(), {}),
    ("V", b"", None),
    ("x", struct.pack(">I", 3) + b"\x00\x01\x02", bytearray(b"\x00\x01\x02")),
]


@pytest.mark.parametrize("tag,raw,expected", TAG_CASES,
                         ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(TAG_CASES)])
def test_decode_each_tag(tag, raw, expected):
    data = _table(_entry(b"key", tag.encode(), raw))
    table, end = decode_table(data, 0)
    assert end == len(data)
    assert list(table) == ["key"]
    value = table["key"]
    assert value == expected
    assert type(value) is type(expected) or (tag in "bBsuIiLlT" and isinstance(value, int))
    if tag == "l":
        assert isinstance(value, Long)
    if tag == "T":
        assert isinstance(value, Timestamp)


def test_every_rabbitmq_tag_covered():
    assert {t for t, _, _ in TAG_CASES} >= set("tbBsuIilfdDSATFVx")


def test_all_tags_in_one_table():
    entries = [_entry(f"k{i}".encode(), tag.encode(), raw) for i, (tag, raw, _) in enumerate(TAG_CASES)]
    data = _table(*entries)
    table, end = decode_table(data, 0)
    assert end == len(data)
    assert table == {f"k{i}": expected for i, (_, _, expected) in enumerate(TAG_CASES)}


@pytest.mark.parametrize("value,tag", [
    (None, b"V"), (True, b"t"), (False, b"t"), (1, b"I"), (-(2**31), b"I"), (2**31, b"l"),
    (Long(1), b"l"), (Timestamp(5), b"T"), ("s", b"S"), (b"s", b"S"), (bytearray(b"s"), b"x"),
    ({}, b"F"), ([], b"A"), ((1, 2), b"A"), (1.5, b"d"), (decimal.Decimal("1.5"), b"D"),
    (datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), b"T"),
])
def test_encoder_tags(value, tag):
    raw = encode_value(value)
    assert raw[:1] == tag
    table, _ = decode_table(encode_table({"v": value}), 0)
    if isinstance(value, datetime.datetime):
        assert table["v"] == int(value.timestamp())
    else:
        assert table["v"] == _normalise(value)


def test_encoder_refuses_unknown_types_and_long_keys():
    with pytest.raises(FieldError):
        encode_value(object())
    with pytest.raises(FieldError):
        encode_table({"k" * 256: 1})


def test_nested_tables_and_arrays_round_trip():
    table = {"a": {"b": {"c": [[], [[1, {"d": [b"e"]}]]]}}, "rich": RICH_TABLE}
    decoded, _ = decode_table(encode_table(table), 0)
    assert decoded == _normalise(table)
    assert decoded["a"]["b"]["c"][1][0][1]["d"] == [b"e"]


def test_float_tag_f_is_single_precision():
    data = _table(_entry(b"f", b"f", struct.pack(">f", 0.1)))
    value = decode_table(data, 0)[0]["f"]
    assert value != 0.1 and math.isclose(value, 0.1, rel_tol=1e-6)


def test_decimal_scale_round_trip():
    for text in ["0", "1.50", "0.001", "123456.7", "1E+2"]:
        d = decimal.Decimal(text)
        assert decode_table(encode_table({"d": d}), 0)[0]["d"] == d
    with pytest.raises(FieldError):  # no sign in RabbitMQ's decimal
        encode_table({"d": decimal.Decimal("-0.001")})


@pytest.mark.parametrize("data", [
    _table(_entry(b"k", b"S", struct.pack(">I", 100) + b"abc")),  # long string overrun
    _table(_entry(b"k", b"x", struct.pack(">I", 100) + b"abc")),  # byte array overrun
    _table(_entry(b"k", b"A", struct.pack(">I", 100))),  # array overrun
    _table(_entry(b"k", b"F", struct.pack(">I", 100))),  # nested table overrun
    _table(_entry(b"k", b"Z", b"")),  # unknown tag
    struct.pack(">I", 100) + b"\x01k",  # table length overrun
    _table(_entry(b"k", b"A", struct.pack(">I", 2) + b"I\x00\x00\x00\x00")),  # array contents overrun
])
def test_decode_table_malformed(data):
    with pytest.raises(FieldError):
        decode_table(data, 0)


def test_table_contents_overrun_its_length():
    # The last value runs past the declared table length (but not past the buffer).
    data = struct.pack(">I", 4) + b"\x01kI" + b"\x00\x00\x00\x00"
    with pytest.raises(FieldError):
        decode_table(data, 0)


def _deep(tag: bytes, levels: int) -> bytes:
    """A table holding ``levels`` nested tables ('F', each under key "k") or arrays."""
    inner = struct.pack(">I", 0)
    for _ in range(levels - 1):
        body = (b"\x01k" if tag == b"F" else b"") + tag + inner
        inner = struct.pack(">I", len(body)) + body
    body = b"\x01k" + tag + inner
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("tag", [b"F", b"A"])
def test_tables_nested_as_deep_as_a_frame_holds_are_accepted(tag):
    # RabbitMQ accepts 18,000 levels (what a 128 KiB frame holds); the decoder and the
    # encoder never recurse, so neither hits Python's recursion limit
    raw = _deep(tag, 18_000)
    assert len(raw) < 131_072
    table, end = decode_table(raw, 0)
    assert end == len(raw)
    depth, value = 0, table["k"]
    while value:
        value = value["k"] if tag == b"F" else value[0]
        depth += 1
    assert depth == 18_000 - 1
    assert encode_table(table) == raw


@pytest.mark.parametrize("tag", [b"F", b"A"])
def test_deep_nesting_cut_short_is_a_field_error(tag):
    raw = _deep(tag, 5000)
    for cut in (len(raw) // 2, len(raw) - 1):
        with pytest.raises((FieldError, IndexError, struct.error)):
            decode_table(raw[:cut], 0)
    # the innermost container claims more than its parent holds
    bad = bytearray(raw)
    bad[-4:] = struct.pack(">I", 1)
    with pytest.raises(FieldError):
        decode_table(bytes(bad) + b"\x00" * 8, 0)


def test_a_table_that_contains_itself_is_refused():
    table: dict = {"a": 1}
    table["self"] = table
    with pytest.raises(FieldError):
        encode_table(table)
    looped: list = [1]
    looped.append({"x": looped})
    with pytest.raises(FieldError):
        encode_value(looped)


def test_shared_values_are_not_a_loop():
    shared = {"s": [1, 2]}
    assert decode_table(encode_table({"a": shared, "b": shared, "c": [shared, shared]}),
                        0)[0] == {"a": shared, "b": shared, "c": [shared, shared]}


def test_reasonable_nesting_is_accepted():
    value: object = 1
    for i in range(50):
        value = {"k": value} if i % 2 else [value]
    decoded, _ = decode_table(encode_table({"v": value}), 0)
    assert decoded == {"v": value}


# ---- basic properties ------------------------------------------------------------

FULL_PROPS = {
    "content_type": "application/json",
    "content_encoding": "gzip",
    "headers": {"x-retry": 3, "x-death": [{"count": Long(1), "reason": b"expired"}], "v": None},
    "delivery_mode": 2,
    "priority": 9,
    "correlation_id": "corr-1",
    "reply_to": "amq.rabbitmq.reply-to",
    "expiration": "60000",
    "message_id": "m" * 255,
    "timestamp": 1_700_000_000,
    "type": "order.created",
    "user_id": "guest",
    "app_id": "ünit",
    "cluster_id": "c1",
}


def test_all_fourteen_properties_round_trip():
    assert len(PROPERTY_FIELDS) == 14 and set(FULL_PROPS) == {n for n, _ in PROPERTY_FIELDS}
    raw = encode_properties(FULL_PROPS)
    assert raw[:2] == b"\xff\xfc"
    assert decode_properties(raw) == FULL_PROPS


def test_empty_properties():
    assert encode_properties({}) == b"\x00\x00"
    assert decode_properties(b"\x00\x00") == {}


@pytest.mark.parametrize("index,name", list(enumerate(n for n, _ in PROPERTY_FIELDS)))
def test_each_single_property(index, name):
    props = {name: FULL_PROPS[name]}
    raw = encode_properties(props)
    assert struct.unpack(">H", raw[:2])[0] == 1 << (15 - index)
    assert decode_properties(raw) == props


@settings(max_examples=300, deadline=None)
@given(st.sets(st.sampled_from([n for n, _ in PROPERTY_FIELDS])), st.data())
def test_property_subsets_round_trip(names, data):
    strategies = {"shortstr": st.text(max_size=30).filter(lambda s: len(s.encode()) <= 255),
                  "octet": st.integers(0, 255), "timestamp": st.integers(0, 2**64 - 1),
                  "table": tables}
    types = dict(PROPERTY_FIELDS)
    props = {n: data.draw(strategies[types[n]]) for n in names}
    decoded = decode_properties(encode_properties(props))
    assert decoded == {k: _normalise(v) if types[k] == "table" else v for k, v in props.items()}


def test_properties_with_continuation_flag_words_are_skipped():
    raw = encode_properties({"priority": 1})
    flags = struct.unpack(">H", raw[:2])[0] | 1
    assert decode_properties(struct.pack(">HH", flags, 0) + raw[2:]) == {"priority": 1}


@pytest.mark.parametrize("raw", [
    b"",
    b"\x80",
    b"\x80\x00",  # content_type flagged, nothing follows
    b"\x80\x00\x05ab",  # shortstr overrun
    b"\x00\x40",  # timestamp flagged, missing
    b"\x20\x00" + struct.pack(">I", 50),  # headers overrun
    b"\x00\x00extra",  # trailing octets
    b"\x00\x01",  # continuation flag, but the next flag word is missing
    b"\x00\x01\x00",
    b"\x00\x01\x00\x01",
])
def test_malformed_properties_raise_field_error(raw):
    with pytest.raises(FieldError):
        decode_properties(raw)


# ---- fast paths -------------------------------------------------------------------

def test_parse_publish_matches_generic_decoder():
    m = spec.Basic.Publish(0, "amq.direct", "route.é", True, False)
    payload = m.encode()
    assert parse_publish(payload) == ("amq.direct", "route.é", True, False)
    m2 = spec.Basic.Publish(0, "", "", False, True)
    assert parse_publish(m2.encode()) == ("", "", False, True)
    for cut in range(len(payload)):
        with pytest.raises(IndexError):
            parse_publish(payload[:cut])


def test_ack_and_nack_frames_match_generic_encoder():
    assert ack_frame(3, 2**64 - 1, True) == method_frame(3, spec.Basic.Ack(2**64 - 1, True))
    assert ack_frame(1, 5, False) == method_frame(1, spec.Basic.Ack(5, False))
    assert nack_frame(2, 7, True) == method_frame(2, spec.Basic.Nack(7, True, False))


@pytest.mark.parametrize("body_len", [0, 1, 4088, 4089, 10000])
def test_deliver_frames_decode(body_len):
    body = bytes(range(256)) * (body_len // 256 + 1)
    body = body[:body_len]
    props = encode_properties({"content_type": "text/plain", "headers": {"a": 1}})
    parts = deliver_frames(7, shortstr("ctag"), 42, True, shortstr("ex"), shortstr("rk"),
                           props, body, 4096)
    frames = FrameReader(frame_max=4096).feed(b"".join(parts))
    assert frames[0][:2] == (spec.FRAME_METHOD, 7)
    assert spec.decode_method(frames[0][2]) == spec.Basic.Deliver("ctag", 42, True, "ex", "rk")
    assert frames[1][:2] == (spec.FRAME_HEADER, 7)
    class_id, size, props_raw = parse_content_header(frames[1][2])
    assert (class_id, size, props_raw) == (60, body_len, props)
    bodies = frames[2:]
    assert all(t == spec.FRAME_BODY and ch == 7 and len(p) <= 4096 - 8 for t, ch, p in bodies)
    assert b"".join(p for _, _, p in bodies) == body
    assert len(bodies) == -(-body_len // (4096 - 8))


def test_content_frames_without_body_is_header_only():
    parts = content_frames(1, b"\x00\x00", b"", 4096)
    frames = FrameReader().feed(b"".join(parts))
    assert len(frames) == 1 and frames[0][0] == spec.FRAME_HEADER


def test_shortstr_helper():
    assert shortstr("ab") == b"\x02ab"
    assert shortstr("") == b"\x00"
    assert raw_frame(1, 2, b"x") == b"\x01\x00\x02\x00\x00\x00\x01x\xce"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.integers(0, 2**32 - 1))
def test_any_wire_decimal_reencodes_identically(scale, raw):
    data = _table(_entry(b"d", b"D", bytes([scale]) + struct.pack(">I", raw)))
    table, _ = decode_table(data, 0)
    assert encode_table(table) == data


def test_namespaces_hold_the_generated_classes() -> None:
    for (class_id, method_id), klass in spec.METHODS.items():
        cls_name, meth_name = klass.NAME.split(".")
        assert getattr(getattr(spec, cls_name), meth_name) is klass
        assert (class_id, method_id) == (klass.CLASS_ID, klass.METHOD_ID)
