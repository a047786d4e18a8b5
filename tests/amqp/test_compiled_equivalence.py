"""The compiled AMQP codec (Cython extension modules built by `make setup` from the same
``.py`` files, ``broker/amqp/builds.py``) against its reference, the pure-Python modules
loaded from source under another package name in this same process: for random field tables
with every AMQP field type, properties, every method, frame streams, content and delivery
frames, and whole connections fed random (partly malformed) input, both give equal results,
or raise the same error with the same text.

Under ``TRIOMQ_PURE=1`` (or without a compiler) both sides are the pure modules and the test
is skipped: the rest of tests/amqp then checks the pure build itself."""
from __future__ import annotations

import dataclasses
import enum
import importlib.abc
import importlib.util
import itertools
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker.amqp
from broker.amqp import builds, codec, connection, fields, spec

from .sansio_helpers import GUEST_PLAIN, HEADER, FakeAuth
from .test_codec import _FIELD_STRATEGIES, ALL_METHODS, field_values, tables
from .test_whole_publish import pieces

pytestmark = pytest.mark.skipif(builds.current() != "compiled",
                                reason="the compiled build is not running (TRIOMQ_PURE or no compiler)")

_ALIAS = "broker._amqp_reference"
_SRC = Path(broker.amqp.__file__).parent


class _ReferenceFinder(importlib.abc.MetaPathFinder):
    """broker._amqp_reference.X: broker/amqp/X.py loaded from source (never the extension)."""

    def find_spec(self, fullname, path, target=None):
        package, _, module = fullname.rpartition(".")
        if package != _ALIAS:
            return None
        return importlib.util.spec_from_file_location(fullname, _SRC / (module + ".py"))


def _reference():
    if _ALIAS not in sys.modules:
        pkg_spec = importlib.machinery.ModuleSpec(_ALIAS, None, is_package=True)
        pkg = importlib.util.module_from_spec(pkg_spec)
        pkg.__path__ = [str(_SRC)]
        sys.modules[_ALIAS] = pkg
        sys.meta_path.insert(0, _ReferenceFinder())
    return tuple(importlib.import_module(f"{_ALIAS}.{m}")
                 for m in ("fields", "spec", "codec", "connection"))


pfields, pspec, pcodec, pconnection = _reference()


def test_the_two_sides_are_the_two_builds():
    for compiled, pure in ((fields, pfields), (spec, pspec), (codec, pcodec), (connection, pconnection)):
        assert not compiled.__file__.endswith(".py"), compiled.__file__
        assert pure.__file__.endswith(".py")


def canon(value):
    """A comparable form across the two builds (their classes are distinct objects)."""
    if isinstance(value, BaseException):
        attrs = {k: canon(v) for k, v in vars(value).items()}
        return ("raised", type(value).__name__, str(value), attrs)
    if isinstance(value, dict):
        return ("dict", [(canon(k), canon(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [canon(v) for v in value])
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (type(value).__name__, bytes(value))
    if isinstance(value, int) and not isinstance(value, bool | enum.Enum):
        return (type(value).__name__, int(value))
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__name__, value.name)
    if isinstance(value, (pspec.Method, spec.Method)):
        return ("method", value.NAME, [canon(getattr(value, f)) for f, _ in value.FIELDS])
    if dataclasses.is_dataclass(value):
        return ("event", type(value).__name__,
                [canon(getattr(value, f.name)) for f in dataclasses.fields(value)])
    return (type(value).__name__, value)


def both(call_compiled, call_pure):
    results = []
    for call in (call_compiled, call_pure):
        try:
            results.append(canon(call()))
        except Exception as exc:  # the same error, same text, is part of the contract
            results.append(canon(exc))
    assert results[0] == results[1]
    return results[0]


# ---- field tables, values and properties -----------------------------------------

def ref(value):
    """``value`` with the compiled module's Long and Timestamp made the reference module's."""
    if isinstance(value, fields.Timestamp):
        return pfields.Timestamp(value)
    if isinstance(value, fields.Long):
        return pfields.Long(value)
    if isinstance(value, dict):
        return {k: ref(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(ref(v) for v in value)
    return value


@settings(max_examples=300, deadline=None)
@given(tables)
def test_tables_encode_and_decode_alike(table):
    raw = both(lambda: fields.encode_table(table), lambda: pfields.encode_table(ref(table)))
    if raw[0] == "bytes":
        both(lambda: fields.decode_table(raw[1], 0), lambda: pfields.decode_table(raw[1], 0))


@settings(max_examples=200, deadline=None)
@given(field_values)
def test_values_encode_alike(value):
    both(lambda: fields.encode_value(value), lambda: pfields.encode_value(ref(value)))


# every field type's tag, followed by random octets: malformed input must fail alike
_TAGS = b"tbBsuIiLlfdDSATFVxU"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=3), st.sampled_from(_TAGS), st.binary(max_size=12)),
                max_size=4), st.integers(-2, 2))
def test_malformed_tables_fail_alike(entries, skew):
    body = b"".join(bytes((len(k),)) + k + bytes((t,)) + v for k, t, v in entries)
    raw = struct.pack(">I", max(0, len(body) + skew)) + body
    both(lambda: fields.decode_table(raw, 0), lambda: pfields.decode_table(raw, 0))


_props = st.fixed_dictionaries({}, optional={
    name: (tables if ftype == "table" else _FIELD_STRATEGIES[ftype]) if ftype != "shortstr"
    else st.text(max_size=20) for name, ftype in fields.PROPERTY_FIELDS})


@settings(max_examples=300, deadline=None)
@given(_props, st.binary(max_size=6))
def test_properties_alike(props, junk):
    raw = both(lambda: fields.encode_properties(props), lambda: pfields.encode_properties(ref(props)))
    if raw[0] == "bytes":
        for data in (raw[1], raw[1] + junk, raw[1][:len(raw[1]) - len(junk)]):
            both(lambda d=data: fields.decode_properties(d), lambda d=data: pfields.decode_properties(d))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_random_properties_decode_alike(raw):
    both(lambda: fields.decode_properties(raw), lambda: pfields.decode_properties(raw))


# ---- methods -------------------------------------------------------------------

@st.composite
def _method_args(draw):
    key, cls = draw(st.sampled_from(ALL_METHODS))
    return key, {name: draw(_FIELD_STRATEGIES[ftype]) for name, ftype in cls.FIELDS}


@settings(max_examples=400, deadline=None)
@given(_method_args(), st.integers(0, 65535), st.binary(max_size=4), st.integers(0, 8))
def test_methods_encode_and_decode_alike(method, channel, junk, cut):
    key, kwargs = method
    frame = both(lambda: codec.method_frame(channel, spec.METHODS[key](**kwargs)),
                 lambda: pcodec.method_frame(channel, pspec.METHODS[key](**ref(kwargs))))
    payload = frame[1][7:-1]
    for data in (payload, payload + junk, payload[:max(0, len(payload) - cut)]):
        both(lambda d=data: spec.decode_method(d), lambda d=data: pspec.decode_method(d))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([k for k, _ in ALL_METHODS] + [(60, 99), (99, 10)]), st.binary(max_size=30))
def test_random_method_payloads_decode_alike(key, args):
    payload = struct.pack(">HH", *key) + args
    both(lambda: spec.decode_method(payload), lambda: pspec.decode_method(payload))


# ---- frames ----------------------------------------------------------------------

_frame = st.builds(
    lambda t, ch, payload, end: struct.pack(">BHI", t, ch, len(payload)) + payload + bytes((end,)),
    st.sampled_from([1, 2, 3, 8, 4]), st.integers(0, 3), st.binary(max_size=40),
    st.sampled_from([0xCE, 0xCE, 0xCE, 0x00]))


def _feed_all(module, chunks, frame_max):
    reader = module.FrameReader(frame_max)
    out = []
    for chunk in chunks:
        try:
            out.append(reader.feed(chunk))
        except module.FrameError as exc:
            out.append(exc)
            out.append(exc.frames)
            break
    return out, reader.buffered


@settings(max_examples=300, deadline=None)
@given(st.lists(_frame, max_size=6), st.lists(st.integers(0, 300), max_size=4),
       st.sampled_from([0, 24, 4096, 131072]))
def test_frame_streams_split_alike(frames, cuts, frame_max):
    data = b"".join(frames)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    both(lambda: _feed_all(codec, chunks, frame_max), lambda: _feed_all(pcodec, chunks, frame_max))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 65535), _props, st.binary(max_size=300), st.sampled_from([8, 9, 20, 100, 4096]),
       st.binary(max_size=20), st.integers(0, 2**64 - 1), st.booleans())
def test_content_and_delivery_frames_alike(channel, props, body, frame_max, tag, dtag, flag):
    props_raw = fields.encode_properties(props)
    both(lambda: codec.content_frames(channel, props_raw, body, frame_max),
         lambda: pcodec.content_frames(channel, props_raw, body, frame_max))
    both(lambda: codec.content_parts(channel, props_raw, body, frame_max),
         lambda: pcodec.content_parts(channel, props_raw, body, frame_max))
    consumer_tag = bytes((len(tag),)) + tag
    args = (channel, consumer_tag, dtag, flag, codec.shortstr("ex"), codec.shortstr("rk"), props_raw, body,
            frame_max)
    both(lambda: codec.deliver_frames(*args), lambda: pcodec.deliver_frames(*args))
    both(lambda: codec.ack_frame(channel, dtag, flag), lambda: pcodec.ack_frame(channel, dtag, flag))
    both(lambda: codec.nack_frame(channel, dtag, flag), lambda: pcodec.nack_frame(channel, dtag, flag))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=30), st.binary(max_size=30))
def test_publish_and_header_parsing_alike(args, header):
    publish = struct.pack(">HH", 60, 40) + args
    both(lambda: codec.parse_publish(publish), lambda: pcodec.parse_publish(publish))
    both(lambda: codec.parse_content_header(header), lambda: pcodec.parse_content_header(header))


# ---- whole connections ------------------------------------------------------------------

def _open_frames():
    from .sansio_helpers import mframe

    return (HEADER + mframe(0, spec.Connection.StartOk({}, "PLAIN", GUEST_PLAIN, "en_US"))
            + mframe(0, spec.Connection.TuneOk(2047, 131072, 60))
            + mframe(0, spec.Connection.Open("/", "", False))
            + mframe(1, spec.Channel.Open("")) + mframe(2, spec.Channel.Open("")))


def _session(module, data, split):
    conn = module.ServerConnection(FakeAuth(), lambda v: v == "/", max_message_size=100)
    out = []
    for i in range(0, len(data), split):
        out.append(conn.receive_data(data[i:i + split]))
        out.append(conn.data_to_send())
    out.append(conn.state)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(pieces, max_size=8), st.sampled_from([1, 7, 64, 100000]))
def test_connections_answer_alike(parts, split):
    data = _open_frames() + b"".join(parts)
    both(lambda: _session(connection, data, split), lambda: _session(pconnection, data, split))

