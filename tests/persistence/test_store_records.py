"""What each store holds byte for byte, and what a record the database refuses does.

In process, against the real backends (the journal, SQLite, PostgreSQL, MariaDB): a
header table with every AMQP field type (raw bytes: what a client sent is what comes
back), NULs and non-UTF-8 bytes in the exchange and routing key of a message (basic.publish
takes a key that is not UTF-8), odd names in definitions and arguments.

A record the database refuses for what it holds must fail alone: its publish is nacked
(and taken back from its queues), a definition is logged as not stored, and every other
publish of the same batch is confirmed -- the store never goes down for it. Before the
fix, a value the driver could not encode escaped the writer (the store's task died) and a
value PostgreSQL refused (NUL) took the store down for everyone until a restart.
"""
from __future__ import annotations

import struct

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.amqp.fields import decode_properties
from broker.broker import Broker
from broker.config import Config
from broker.exchanges import EXCHANGE_TYPES
from broker.message import Message
from broker.persistence.journal import JournalStore
from broker.persistence.sql import SQLStore
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue

from .test_sql_store import _make_db

NONUTF8 = b"\xff\xfe\x80".decode("utf-8", "surrogateescape")


def _s(b: bytes) -> bytes:
    return bytes((len(b),)) + b


def _every_type_table() -> bytes:
    """A field table with every AMQP 0-9-1 / RabbitMQ field type, nested, with NULs."""
    inner = (_s(b"deep\x00") + b"S" + struct.pack(">I", 3) + b"\x00\x00\x00"
             + _s(b"x") + b"x" + struct.pack(">I", 2) + b"\x00\xff")
    array = (b"b\x80" + b"S" + struct.pack(">I", 1) + b"\x00"
             + b"F" + struct.pack(">I", len(inner)) + inner + b"V")
    fields = [
        (b"t", b"t\x01"), (b"b", b"b\xff"), (b"B", b"B\xff"), (b"s", b"s" + struct.pack(">h", -2)),
        (b"u", b"u" + struct.pack(">H", 65535)), (b"I", b"I" + struct.pack(">i", -(2**31))),
        (b"i", b"i" + struct.pack(">I", 2**32 - 1)), (b"l", b"l" + struct.pack(">q", -(2**63))),
        (b"L", b"L" + struct.pack(">q", 2**63 - 1)), (b"f", b"f" + struct.pack(">f", 1.5)),
        (b"d", b"d" + struct.pack(">d", -1e300)), (b"D", b"D\x03" + struct.pack(">I", 12345)),
        (b"S", b"S" + struct.pack(">I", 100_000) + b"\x00" * 50_000 + b"\xff" * 50_000),
        (b"x", b"x" + struct.pack(">I", 4) + b"\x00\x01\xfe\xff"),
        (b"A", b"A" + struct.pack(">I", len(array)) + array),
        (b"F", b"F" + struct.pack(">I", len(inner)) + inner),
        (b"T", b"T" + struct.pack(">Q", 1_790_000_000)), (b"V", b"V"),
        (b"\x00nul key", b"S" + struct.pack(">I", 0)), (b"\xff\xfe", b"t\x00"),
        (b"\xef\x9c\x80", b"S" + struct.pack(">I", 3) + "\uf700".encode()),
    ]
    body = b"".join(_s(k) + v for k, v in fields)
    return struct.pack(">I", len(body)) + body


def _props_raw() -> bytes:
    # property flags: headers (bit 13), delivery mode (bit 12); then the two values
    return struct.pack(">H", 0x2000 | 0x1000) + _every_type_table() + b"\x02"


def _message(exchange: str, key: str, body: bytes) -> Message:
    raw = _props_raw()
    return Message(exchange, key, raw, decode_properties(raw), body)


class Life:
    """One broker lifetime on a store (the run loop live in a nursery)."""

    def __init__(self, kind: str, where: str):
        if kind == "journal":
            self.store = JournalStore(where)
            self.broker = Broker(Config(data_dir=where), self.store)
        else:
            self.store = SQLStore(where)
            self.broker = Broker(Config(), self.store)
        self.vhost = self.broker.vhosts["/"]
        self._settled = trio.Event()  # set by every publish settled

    async def __aenter__(self):
        await self.store.open()
        self.broker.recover()
        self._cm = trio.open_nursery()
        self.nursery = await self._cm.__aenter__()
        self.nursery.start_soon(self.store.run)
        return self

    async def __aexit__(self, *exc):
        self.nursery.cancel_scope.cancel()
        await self._cm.__aexit__(None, None, None)
        with trio.CancelScope(shield=True):
            await self.store.close()

    def publish(self, results: dict, tag, queues, message: Message | None) -> None:
        """Enqueue into ``queues`` and ask for durability, as Channel.route_message does."""
        for q in queues:
            q.enqueue(message)

        def settle(ok: bool) -> None:
            results[tag] = ok
            self._settled.set()
        self.store.when_durable(lambda: settle(True), on_failure=lambda: settle(False))

    async def settled(self, results: dict, n: int, limit: float = 30.0) -> None:
        with trio.fail_after(limit):
            while len(results) < n:
                self._settled = trio.Event()
                if len(results) < n:
                    await self._settled.wait()


def _queue(life: Life, name: str, arguments: dict | None = None) -> Queue:
    args = arguments or {}
    q = Queue(life.vhost, name, durable=True, arguments=args, opts=parse_queue_arguments(args))
    life.vhost.add_queue(q)
    return q


@pytest.fixture(params=["journal", "sqlite", "postgresql", "mysql"])
def store(request, tmp_path):
    """(kind, where: a journal directory or a database URL)."""
    if request.param == "journal":
        yield "journal", str(tmp_path / "journal")
        return
    db = _make_db(request.param)
    yield request.param, db.url
    db.drop()


QNAME = "q\x00\uf700\uf701" + "é" * 10
XNAME = "x\x00\uf7ff"
KEYS = ["k\x00", "", "\uf780" * 3, "é\x00" * 40, "long." * 200]  # the last: as HTTP may give
BODIES = [b"", b"\x00" * 10, bytes(range(256)) * 100]
# in their wire form (a long string decodes as bytes), as a declare hands them to the store
ARGS = {"x-nul\x00": "v\x00\uf700".encode(), "nested": {"a": [b"\x00\xff", b"\x00"]},
        "bytes": b"\xff", "\uf701key": 7}
QARGS = {"x-note": b"\x00\xff", "x-\x00": {"t": True}}


@pytest.mark.timeout(120)
def test_every_field_type_names_and_bodies_round_trip_byte_for_byte(store):
    kind, where = store
    sent = [_message(XNAME, key + NONUTF8, body) for key in KEYS for body in BODIES]

    async def first():
        async with Life(kind, where) as life:
            x = EXCHANGE_TYPES["direct"](XNAME, durable=True, auto_delete=False, internal=False,
                                         arguments=dict(ARGS))
            life.vhost.exchanges[XNAME] = x
            life.store.save_exchange(life.vhost, x)
            q = _queue(life, QNAME, dict(QARGS))
            for key in KEYS:
                life.vhost.bind(XNAME, q, key, {"arg\x00": key.encode()})
            results: dict = {}
            for i, m in enumerate(sent):
                life.publish(results, i, [q], m)
            await life.settled(results, len(sent))
            assert all(results.values()), results

    async def second():
        async with Life(kind, where) as life:
            x = life.vhost.exchanges[XNAME]
            assert x.arguments == ARGS
            q = life.vhost.queues[QNAME]
            assert q.arguments == QARGS
            got = []
            while q.ready:
                entry = q.ready.popleft()
                got.append(entry.message)
            assert len(got) == len(sent)
            for m, s in zip(got, sent, strict=True):
                assert (m.exchange, m.routing_key, m.body) == (s.exchange, s.routing_key, s.body)
                assert bytes(m.props_raw) == s.props_raw
            assert len(q.bindings) == len(KEYS)  # (exchange, binding key) per routing key
            assert {(src, k[2]) for src, k in q.bindings} == {(XNAME, key) for key in KEYS}
    trio.run(first)
    trio.run(second)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_a_record_the_database_refuses_fails_alone(kind, caplog):
    """A queue whose arguments no driver can encode (a lone surrogate, as JSON's "\\ud800"
    gives) and a message whose exchange name is longer than a shortstr: each one's publish
    is nacked, the others' confirmed, the store stays up; after a restart the good queue
    and its messages are back and the refused queue is not (its refusal was logged)."""
    db = _make_db(kind)
    try:
        async def first():
            async with Life(kind, db.url) as life:
                good = _queue(life, "good\x00")
                bad = _queue(life, "bad", {"x-note": "\ud800"})
                results: dict = {}
                life.publish(results, "good", [good], _message("", "k", b"1"))
                life.publish(results, "bad queue", [bad], _message("", "k", b"2"))
                life.publish(results, "both", [good, bad], _message("", "k", b"3"))
                life.publish(results, "bad message", [good], _message("x" * 300, "k", b"4"))
                await life.settled(results, 4)
                assert results == {"good": True, "bad queue": False, "both": False,
                                   "bad message": False}
                assert not life.store._down
                # nacked = taken back from the queues: never delivered
                assert [e.message.body for e in good.ready] == [b"1"]
                assert not bad.ready
                # the store goes on: a later publish, and one to the refused queue again
                results.clear()
                life.publish(results, "later", [good], _message("", "k", b"5"))
                life.publish(results, "bad again", [bad], _message("", "k", b"6"))
                await life.settled(results, 2)
                assert results == {"later": True, "bad again": False}
                assert not life.store._down

        async def second():
            async with Life(kind, db.url) as life:
                good = life.vhost.queues["good\x00"]
                assert [e.message.body for e in good.ready] == [b"1", b"5"]
                assert "bad" not in life.vhost.queues
        with caplog.at_level("ERROR", logger="broker.store.sql"):
            trio.run(first)
        assert "refused queue 'bad'" in caplog.text
        assert "database lost" not in caplog.text
        trio.run(second)
    finally:
        db.drop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_schema_v3_names_are_rewritten_and_long_routing_keys_fit(kind):
    """A database written before v4: names were stored raw (SQLite and MariaDB held a NUL,
    any database a character of the escape block) and the routing key was VARCHAR(255).
    Opening it migrates in place: every name reads back as it was written, and a routing key
    longer than a shortstr (the HTTP API takes one) is stored from then on."""
    import sqlalchemy

    from broker.persistence import sql_schema as S
    db = _make_db(kind)
    raw_names = ["block\uf780\uf700", "plain"] + (["nul\x00raw"] if kind != "postgresql" else [])
    long_key = "t/" + "é" * 400
    try:
        async def create():
            async with Life(kind, db.url):
                pass
        trio.run(create)
        engine = sqlalchemy.create_engine(db.url)
        with engine.begin() as c:  # what a v3 broker left behind
            if kind == "postgresql":
                c.exec_driver_sql("ALTER TABLE triomq_bindings ALTER COLUMN routing_key "
                                  "TYPE VARCHAR(255)")
            elif kind == "mysql":
                c.exec_driver_sql("ALTER TABLE triomq_bindings MODIFY routing_key VARCHAR(255) "
                                  "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL")
            for qid, name in enumerate(raw_names, 1):
                c.execute(sqlalchemy.insert(S.queues).values(
                    qid=qid, vhost="/", name=name, auto_delete=False, arguments=b""))
            c.execute(sqlalchemy.update(S.lock).values(schema_version=3))
        engine.dispose()

        async def migrated():
            async with Life(kind, db.url) as life:
                assert set(raw_names) <= set(life.vhost.queues)
                q = life.vhost.queues[raw_names[0]]
                life.vhost.bind("amq.topic", q, long_key, {})
                results: dict = {}
                life.publish(results, "m", [q], _message("amq.topic", long_key, b"x"))
                await life.settled(results, 1)
                assert results == {"m": True} and not life.store._down

        async def again():
            async with Life(kind, db.url) as life:
                q = life.vhost.queues[raw_names[0]]
                assert ("amq.topic", long_key) in {(src, k[2]) for src, k in q.bindings}
                assert [e.message.body for e in q.ready] == [b"x"]
        trio.run(migrated)
        trio.run(again)
    finally:
        db.drop()


# ---------------------------------------------------------------- fuzz (hypothesis)


def _field(tag: bytes, fmt: str):
    return st.binary(min_size=struct.calcsize(fmt), max_size=struct.calcsize(fmt)).map(
        lambda raw: tag + raw)


_LEAVES = st.one_of(
    _field(b"t", ">B"), _field(b"b", ">B"), _field(b"B", ">B"), _field(b"s", ">h"),
    _field(b"u", ">H"), _field(b"I", ">i"), _field(b"i", ">I"), _field(b"l", ">q"),
    _field(b"L", ">q"), _field(b"f", ">f"), _field(b"d", ">d"), _field(b"D", ">BI"),
    _field(b"T", ">Q"), st.just(b"V"),
    st.binary(max_size=3000).map(lambda b: b"S" + struct.pack(">I", len(b)) + b),
    st.binary(max_size=300).map(lambda b: b"x" + struct.pack(">I", len(b)) + b),
)


def _table(pairs: list) -> bytes:
    body = b"".join(_s(k) + v for k, v in pairs)
    return struct.pack(">I", len(body)) + body


_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(st.tuples(st.binary(max_size=20), inner), max_size=5).map(lambda p: b"F" + _table(p)),
    st.lists(inner, max_size=5).map(
        lambda vs: b"A" + struct.pack(">I", len(b"".join(vs))) + b"".join(vs))), max_leaves=20)
_HEADERS = st.lists(st.tuples(st.binary(max_size=40), _VALUES), max_size=8).map(_table)
_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",))
                 | st.sampled_from(["\x00", "\uf700", "\uf701", "\uf780"]), min_size=1,
                 max_size=60).filter(lambda s: len(s.encode()) <= 255 and not s.startswith("amq."))


@pytest.mark.timeout(300)
def test_fuzzed_headers_keys_names_bodies_round_trip(store):
    """Hypothesis draws raw header tables (every field type, nested, any bytes), routing
    keys of any bytes, queue names and bodies; each example is two lifetimes on the same
    store and must give back every message byte for byte."""
    kind, where = store
    counter = [0]

    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(name=_NAMES, msgs=st.lists(st.tuples(_HEADERS, st.binary(max_size=255),
                                                st.binary(max_size=20_000)),
                                      min_size=1, max_size=6))
    def run(name, msgs):
        counter[0] += 1
        qname = f"{counter[0]}\x00{name}"[:60]  # NUL in every name: what PostgreSQL refused
        sent = [Message("", key.decode("utf-8", "surrogateescape"),
                        struct.pack(">H", 0x3000) + headers + b"\x02",
                        decode_properties(struct.pack(">H", 0x3000) + headers + b"\x02"), body)
                for headers, key, body in msgs]

        async def first():
            async with Life(kind, where) as life:
                q = _queue(life, qname)
                results: dict = {}
                for i, m in enumerate(sent):
                    life.publish(results, i, [q], m)
                await life.settled(results, len(sent))
                assert all(results.values()), results

        async def second():
            async with Life(kind, where) as life:
                q = life.vhost.queues[qname]
                got = [q.ready.popleft().message for _ in range(len(q.ready))]
                assert [(m.routing_key, bytes(m.props_raw), m.body) for m in got] == \
                    [(m.routing_key, m.props_raw, m.body) for m in sent]
                life.vhost.delete_queue(q)
                results: dict = {}
                life.publish(results, "deleted", [], None)  # the delete written
                await life.settled(results, 1)
        trio.run(first)
        trio.run(second)
    run()
