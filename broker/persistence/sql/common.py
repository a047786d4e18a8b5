"""Shared pieces of the SQL store: its constants, its two lease errors and small helpers
(driver error texts, socket reset, keys of bindings and metadata). No state, no I/O of its own."""
from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from ...queues.ops import Op
from ..base import StoreUnavailable
from ..records import (
    BindingDef,
    encode_arguments,
)

log = logging.getLogger("broker.store.sql")
_T = TypeVar("_T")

CHUNK = 500          # ids per IN (...) list
NAN = float("nan")
DELIVERIES_MAX = 1_000_000  # stored delivery counts saturate here
_ENQUEUE, _DELIVER, _REQUEUE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE
PAGER_RETRY = 1.0    # seconds before reading a page again after the database failed
ORPHAN_GC_DELAY = 5.0  # seconds after start-up before orphaned messages are collected
ORPHAN_GC_RANGE = 50_000  # message ids per clean-up statement
IDLE_RECHECK = 20.0  # seconds idle after which the writer's connection is pinged before use
# index entries read per step once the broker serves (Loader._load_rest): one worker-thread
# read of about 0.1 s, then a few ms on the event loop to append them
INDEX_STEP = 50_000


class StoreLocked(StoreUnavailable):
    """Another broker holds the lease."""


class StoreDeposed(StoreUnavailable):
    """Another broker took the lease over while this one ran: it must stop for good."""


def _abort_socket(conn: Any, dialect: str) -> None:
    """Reset (RST, SO_LINGER 0) the socket of a connection a blocked thread still uses,
    so nothing it buffered (a COMMIT) reaches the server later; that thread then fails."""
    try:
        dbapi = conn.connection.dbapi_connection
        fd = None
        if dialect == "postgresql":  # psycopg 3
            fd = dbapi.pgconn.socket
        elif dialect == "mysql" and dbapi._sock is not None:  # PyMySQL
            fd = dbapi._sock.fileno()
        if fd is None or fd < 0:
            return
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
    except Exception:
        pass


def _safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return str(url)


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message, without SQLAlchemy's boilerplate."""
    orig = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
    msg = str(orig).strip().splitlines()
    line = msg[0] if msg else type(orig).__name__
    return line.strip()


def _refused_record(exc: BaseException) -> bool:
    """True if ``exc`` is the database (or the encoding on the way to it) refusing a value of
    one record -- a string too long, a character it cannot hold -- with the connection
    intact; False for what every write would meet (connection, lease, timeout)."""
    if isinstance(exc, (DataError, IntegrityError)):
        return not exc.connection_invalidated
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        return True  # a parameter the driver could not encode
    return isinstance(exc, (ValueError, TypeError))  # our own encoding (UnicodeError, a table)


def _printable(name: str) -> str:
    """A name for a report: as is, or escaped if it holds NUL, bytes or control characters."""
    return name if name.isprintable() else ascii(name)[1:-1]


def _binding_key(b: BindingDef) -> str:
    h = hashlib.sha1()
    for part in (b.vhost, b.source, b.destination_kind, b.destination, b.routing_key):
        try:
            raw = part.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate that stands for no byte (not from AMQP)
            raw = part.encode("utf-8", "surrogatepass")
        h.update(raw + b"\0")
    h.update(encode_arguments(b.arguments))
    return h.hexdigest()


def _meta_key(kind: str, key: str) -> str:
    return hashlib.sha1(f"{kind}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()


def _chunks(seq: Iterable[_T], n: int = CHUNK) -> Iterator[list[_T]]:
    seq = list(seq)
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
