"""Tables of the SQL store (SQLAlchemy Core), in the spirit of ActiveMQ's JDBC adapter.

ActiveMQ            TrioMQ
ACTIVEMQ_MSGS   ->  triomq_msgs      one row per persistent message (blob from records.encode_message)
ACTIVEMQ_ACKS   ->  triomq_entries   one row per (durable queue, message) still to be acked
ACTIVEMQ_LOCK   ->  triomq_lock      the lease of the running broker (owner, expires_at)
(destinations)  ->  triomq_exchanges, triomq_queues, triomq_bindings
(metadata)      ->  triomq_meta      users, vhosts, permissions, policies... (Store.save_meta)
(statistics)    ->  triomq_totals    per queue: stored entries, body bytes, highest seq, kept by
                                     triggers on triomq_entries (sql_totals.py)
"""
from __future__ import annotations

from sqlalchemy import (
                        BigInteger,
                        Boolean,
                        Column,
                        Float,
                        Index,
                        Integer,
                        LargeBinary,
                        MetaData,
                        SmallInteger,
                        String,
                        Table,
                        Text,
                        UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

# 1: triomq_lock held with SELECT ... FOR UPDATE; 2: lease (adds triomq_lock.expires_at);
# 3: triomq_entries.size (body bytes) and .deliveries; 4: names escaped (sql_names: NUL, lone
# surrogates and U+F700..U+F7FF); 5: triomq_totals and its triggers (sql_totals.install, at open
# when missing). ``migrate`` adds the columns and rewrites the rare names in
# place: an older database opens unchanged otherwise.
SCHEMA_VERSION = 5

# MariaDB/MySQL: case- and accent-sensitive names, and blobs over 64 KiB.
NAME_MAX = 255
NAME = String(NAME_MAX).with_variant(
    mysql.VARCHAR(NAME_MAX, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
KEY = Text().with_variant(mysql.MEDIUMTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql",
                          "mariadb")
BLOB = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")

metadata = MetaData()

msgs = Table(
    "triomq_msgs", metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("body", BLOB, nullable=False),
)

entries = Table(
    "triomq_entries", metadata,
    Column("qid", BigInteger, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("message_id", BigInteger, nullable=False),
    Column("expires_at", Float(53), nullable=True),  # wall clock (time.time())
    Column("priority", SmallInteger, nullable=False, default=0),
    Column("delivered", Boolean, nullable=False, default=False),
    # body bytes, so that start-up reads the index without touching the messages (v3;
    # NULL in rows written by an older version)
    Column("size", BigInteger, nullable=True),
    # deliveries so far (x-delivery-count, delivery limits, retry levels; v3: NULL in older
    # rows, where ``delivered`` counts as one)
    Column("deliveries", Integer, nullable=True),
    Index("triomq_entries_msg", "message_id"),
)

lock = Table(
    "triomq_lock", metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("owner", String(255), nullable=True),
    Column("acquired_at", Float(53), nullable=True),
    Column("expires_at", Float(53), nullable=True),  # wall clock end of the lease (v2)
    Column("schema_version", Integer, nullable=False, default=SCHEMA_VERSION),
)

exchanges = Table(
    "triomq_exchanges", metadata,
    Column("vhost", NAME, primary_key=True),
    Column("name", NAME, primary_key=True),
    Column("type", String(64), nullable=False),
    Column("auto_delete", Boolean, nullable=False),
    Column("internal", Boolean, nullable=False),
    Column("arguments", BLOB, nullable=False),
)

queues = Table(
    "triomq_queues", metadata,
    Column("qid", BigInteger, primary_key=True, autoincrement=False),
    Column("vhost", NAME, nullable=False),
    Column("name", NAME, nullable=False),
    Column("auto_delete", Boolean, nullable=False),
    Column("arguments", BLOB, nullable=False),
    UniqueConstraint("vhost", "name", name="triomq_queues_name"),
)

bindings = Table(
    "triomq_bindings", metadata,
    Column("bkey", String(40), primary_key=True),  # sha1 of all the fields below
    Column("vhost", NAME, nullable=False),
    Column("source", NAME, nullable=False),
    Column("destination_kind", String(16), nullable=False),
    Column("destination", NAME, nullable=False),
    # not indexed, so unbounded: a key given over HTTP may be longer than a shortstr (v4)
    Column("routing_key", KEY, nullable=False),
    Column("arguments", BLOB, nullable=False),
)

# keyed by a digest: (kind, key) may be longer than an index allows on MariaDB
meta = Table(
    "triomq_meta", metadata,
    Column("mkey", String(40), primary_key=True),  # sha1 of kind + NUL + key
    Column("kind", String(64), nullable=False),
    Column("name", Text().with_variant(mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"),
                                       "mysql", "mariadb"), nullable=False),
    Column("value", Text().with_variant(mysql.LONGTEXT(charset="utf8mb4"), "mysql", "mariadb"),
           nullable=False),  # JSON text
    Column("seq", BigInteger, nullable=False),  # write order, so recovery replays it in order
)

# what a start reads instead of grouping every entry: one row per queue, kept exact by
# triggers in each transaction that inserts or deletes entries (sql_totals.py)
totals = Table(
    "triomq_totals", metadata,
    Column("qid", BigInteger, primary_key=True, autoincrement=False),
    Column("entries", BigInteger, nullable=False, default=0),
    Column("top_seq", BigInteger, nullable=False, default=0),
    Column("nbytes", BigInteger, nullable=False, default=0),   # of rows with their size
    Column("unsized", BigInteger, nullable=False, default=0),  # rows without (older versions)
    Column("expiring", BigInteger, nullable=False, default=0),  # rows with an expiry
)

ALL_TABLES = (msgs, entries, lock, exchanges, queues, bindings, meta, totals)


def up_to_date(conn: Connection) -> bool:
    """The database is at SCHEMA_VERSION already (every table there: the version row is
    written once ``create_all`` and ``migrate`` ran): a start skips both, about ten catalog
    queries."""
    from sqlalchemy import inspect as sa_inspect
    from sqlalchemy import select
    if not sa_inspect(conn).has_table(lock.name):
        return False
    current: bool = conn.execute(select(lock.c.schema_version).where(lock.c.id == 1)).scalar() \
        == SCHEMA_VERSION
    return current


def migrate(conn: Connection) -> None:
    """Bring an existing database to SCHEMA_VERSION (after ``metadata.create_all``)."""
    from sqlalchemy import inspect as sa_inspect
    from sqlalchemy import select, text, update
    cols = {c["name"] for c in sa_inspect(conn).get_columns(lock.name)}
    if "expires_at" not in cols:
        kind = {"postgresql": "DOUBLE PRECISION", "sqlite": "REAL"}.get(conn.dialect.name, "DOUBLE")
        conn.execute(text(f"ALTER TABLE {lock.name} ADD COLUMN expires_at {kind} NULL"))
    have = {c["name"] for c in sa_inspect(conn).get_columns(entries.name)}
    if "size" not in have:
        conn.execute(text(f"ALTER TABLE {entries.name} ADD COLUMN size BIGINT NULL"))
    if "deliveries" not in have:
        conn.execute(text(f"ALTER TABLE {entries.name} ADD COLUMN deliveries INTEGER NULL"))
    version = conn.execute(select(lock.c.schema_version).where(lock.c.id == 1)).scalar()
    if version is not None and version < 4:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"ALTER TABLE {bindings.name} ALTER COLUMN routing_key TYPE TEXT"))
        elif conn.dialect.name in ("mysql", "mariadb"):
            conn.execute(text(f"ALTER TABLE {bindings.name} MODIFY routing_key MEDIUMTEXT CHARACTER SET "
                              f"utf8mb4 COLLATE utf8mb4_bin NOT NULL"))
        _escape_names(conn)
    conn.execute(update(lock).where(lock.c.schema_version < SCHEMA_VERSION)
                 .values(schema_version=SCHEMA_VERSION))


# the text columns holding names, and each table's key
_NAMED = ((exchanges, ("vhost", "name"), ("vhost", "name")),
          (queues, ("vhost", "name"), ("qid",)),
          (bindings, ("vhost", "source", "destination", "routing_key"), ("bkey",)),
          (meta, ("name",), ("mkey",)))


def _escape_names(conn: Connection) -> None:
    """v4: rewrite the names an older version stored raw that v4 stores escaped (a NUL
    SQLite or MariaDB held, a character of sql_names' reserved block); once, at migration."""
    from sqlalchemy import select, update

    from .sql_names import db_name, needs_escape
    for table, cols, key in _NAMED:
        for row in list(conn.execute(select(table))):
            m = row._mapping
            new = {c: db_name(m[c]) for c in cols if needs_escape(m[c])}
            if new:
                conn.execute(update(table).where(*(table.c[k] == m[k] for k in key)).values(**new))
