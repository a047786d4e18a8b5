"""``python -m broker inspect --store URL``: row counts per table and live messages per
queue, read without taking the lease. Not used by a running broker."""
from __future__ import annotations

import os
import time

from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from .. import sql_schema as S
from ..base import StoreUnavailable
from ..sql_names import from_db as D
from .common import (
    _printable,
    _reason,
    _safe_url,
)


def inspect(url: str) -> str:
    """Row counts per table and live messages per queue (does not take the lock)."""
    safe = _safe_url(url)
    connect_args = {"connect_timeout": 5} if not url.startswith("sqlite") else {}
    if url.startswith("sqlite"):
        db = make_url(url).database or ""
        if db not in ("", ":memory:") and not os.path.exists(db):
            raise StoreUnavailable(f"cannot open store {safe}: no such file {db}")

    try:
        engine = create_engine(url, connect_args=connect_args, poolclass=NullPool)
        with engine.connect() as c:
            lines = [f"store {safe}"]
            present = set(c.dialect.get_table_names(c))
            for t in S.ALL_TABLES:
                if t.name in present:
                    n = c.execute(select(func.count()).select_from(t)).scalar_one()
                    lines.append(f"  {t.name:<18} {n:>10} rows")
                else:
                    lines.append(f"  {t.name:<18}    (missing)")
            if S.lock.name in present:
                row = c.execute(select(S.lock.c.owner, S.lock.c.acquired_at)
                                .where(S.lock.c.id == 1)).first()
                if row is not None and row.owner:
                    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row.acquired_at or 0))
                    lines.append(f"  last lock owner: {row.owner} at {when}")
            if {S.queues.name, S.entries.name, S.msgs.name} <= present:
                Q, E, M = S.queues, S.entries, S.msgs
                stmt = (select(Q.c.vhost, Q.c.name, func.count(E.c.seq),
                               func.coalesce(func.sum(func.length(M.c.body)), 0))
                        .select_from(Q.outerjoin(E, E.c.qid == Q.c.qid)
                                     .outerjoin(M, M.c.id == E.c.message_id))
                        .group_by(Q.c.vhost, Q.c.name).order_by(Q.c.vhost, Q.c.name))
                rows = list(c.execute(stmt))
                lines.append(f"  durable queues: {len(rows)}")
                for vhost, name, n, size in rows:
                    vhost, name = _printable(D(vhost)), _printable(D(name))
                    lines.append(f"    {vhost!s:<8} {name:<40} {n:>8} messages {int(size):>12} bytes")
        engine.dispose()
        return "\n".join(lines)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable(f"cannot open store {safe}: {_reason(exc)}") from None
