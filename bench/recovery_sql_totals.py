"""What the SQL store's kept totals (``triomq_totals``, broker/persistence/sql_totals.py) cost
and save, in one run.

1. Start: on a scratch PostgreSQL database holding ``--messages`` queued (built by SQL as
   ``bench.recovery_sql_start`` builds it), the totals a start reads -- the kept row per
   queue against the ``GROUP BY`` over every entry that PostgreSQL used before -- and the
   store's whole open (schema, lease, totals, first window), ``--runs`` times each,
   alternated.
2. Write path: per entry, a batch of ``--batch`` entries inserted then deleted through the
   store's own writer (``SQLStore._write``), with the triggers and without them,
   alternated, on PostgreSQL, MariaDB and SQLite (the row triggers the last two would
   need are created for the measure only).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import trio
from sqlalchemy import text

from .recovery_sql_start import build
from .store_names import _scratch_pg

# what MariaDB and SQLite would need: row triggers (measured here, not used by the store)
_ROW_TRIGGERS = {
    "mysql": (
        """CREATE TRIGGER triomq_entries_totals_ins AFTER INSERT ON triomq_entries FOR EACH ROW
           INSERT INTO triomq_totals (qid, entries, top_seq, nbytes, unsized, expiring)
           VALUES (NEW.qid, 1, NEW.seq, COALESCE(NEW.size, 0), NEW.size IS NULL,
                   NEW.expires_at IS NOT NULL)
           ON DUPLICATE KEY UPDATE entries = entries + 1, top_seq = GREATEST(top_seq, NEW.seq),
             nbytes = nbytes + COALESCE(NEW.size, 0), unsized = unsized + (NEW.size IS NULL),
             expiring = expiring + (NEW.expires_at IS NOT NULL)""",
        """CREATE TRIGGER triomq_entries_totals_del AFTER DELETE ON triomq_entries FOR EACH ROW
           UPDATE triomq_totals SET entries = entries - 1, nbytes = nbytes - COALESCE(OLD.size, 0),
             unsized = unsized - (OLD.size IS NULL), expiring = expiring - (OLD.expires_at IS NOT NULL)
           WHERE qid = OLD.qid"""),
    "sqlite": (
        """CREATE TRIGGER triomq_entries_totals_ins AFTER INSERT ON triomq_entries FOR EACH ROW
           BEGIN
             INSERT OR IGNORE INTO triomq_totals (qid, entries, top_seq, nbytes, unsized, expiring)
               VALUES (NEW.qid, 0, NEW.seq, 0, 0, 0);
             UPDATE triomq_totals SET entries = entries + 1, top_seq = MAX(top_seq, NEW.seq),
               nbytes = nbytes + COALESCE(NEW.size, 0), unsized = unsized + (NEW.size IS NULL),
               expiring = expiring + (NEW.expires_at IS NOT NULL) WHERE qid = NEW.qid;
           END""",
        """CREATE TRIGGER triomq_entries_totals_del AFTER DELETE ON triomq_entries FOR EACH ROW
           BEGIN
             UPDATE triomq_totals SET entries = entries - 1, nbytes = nbytes - COALESCE(OLD.size, 0),
               unsized = unsized - (OLD.size IS NULL),
               expiring = expiring - (OLD.expires_at IS NOT NULL) WHERE qid = OLD.qid;
           END"""),
}


def start(url: str, runs: int) -> None:
    from broker.persistence.sql import SQLStore
    from broker.persistence.sql.index import IndexReader
    for _ in range(runs):
        for label, sql in (("GROUP BY over the entries", IndexReader._TOTALS_SQL),
                           ("kept totals (one row per queue)", IndexReader._TOTALS_KEPT_SQL)):
            s = SQLStore(url)
            t = time.perf_counter()
            s._open_sync()
            opened = time.perf_counter() - t
            with s.engine.connect() as c:
                t = time.perf_counter()
                c.execute(text(sql)).all()
                took = time.perf_counter() - t
            s._close_sync()
            print(f"  {label}: {took * 1000:.0f} ms; the store's open {opened:.2f} s "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)


def _drop_triggers(c, kind: str) -> None:
    for name in ("triomq_entries_totals_ins", "triomq_entries_totals_del"):
        c.execute(text(f"DROP TRIGGER IF EXISTS {name}"
                       + (" ON triomq_entries" if kind == "postgresql" else "")))


def write_cost(kind: str, url: str, batches: int, per: int, rounds: int) -> None:
    from broker.persistence import sql_totals
    from broker.persistence.sql import SQLStore
    from broker.persistence.sql.state import _Batch
    store = SQLStore(url)
    trio.run(store.open)
    res: dict[bool, list[float]] = {True: [], False: []}
    seq = 0
    for _ in range(rounds):
        for on in (True, False):
            with store.engine.begin() as c:
                _drop_triggers(c, kind)
                if on and kind == "postgresql":
                    sql_totals.install(c, kind)
                elif on:
                    for ddl in _ROW_TRIGGERS[kind]:
                        c.execute(text(ddl))
            t = time.perf_counter()
            for _ in range(batches):
                b = _Batch()
                b.enq[1] = {seq + j: [seq + j, None, 0, False, 64, None] for j in range(per)}
                assert store._write(b, store._gen) is None
                gone = _Batch()
                gone.rm[1] = set(range(seq, seq + per))
                assert store._write(gone, store._gen) is None
                seq += per
            res[on].append((time.perf_counter() - t) / (batches * per) * 1e6)
    with store.engine.begin() as c:  # as the store keeps it
        _drop_triggers(c, kind)
        if kind == "postgresql":
            sql_totals.install(c, kind)
    trio.run(store.close)
    print(f"  {kind}: per entry inserted and deleted, with triggers "
          + " / ".join(f"{x:.1f}" for x in res[True]) + " us, without "
          + " / ".join(f"{x:.1f}" for x in res[False]) + f" us (load {os.getloadavg()[0]:.1f})",
          flush=True)


def _mysql_db():
    import secrets

    import pymysql
    name = "triomq_bench_" + secrets.token_hex(6)

    def admin(sql: str) -> None:
        c = pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", autocommit=True)
        try:
            with c.cursor() as cur:
                cur.execute(sql)
        finally:
            c.close()
    admin(f"CREATE DATABASE `{name}`")
    return f"mysql+pymysql://root@127.0.0.1:3306/{name}", lambda: admin(f"DROP DATABASE `{name}`")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recovery_sql_totals",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--skip-start", action="store_true")
    args = ap.parse_args(argv)
    print("Command: `python -m bench.recovery_sql_totals "
          + " ".join(argv if argv is not None else sys.argv[1:]) + "`", flush=True)
    if not args.skip_start:
        url, drop = _scratch_pg("127.0.0.1", 5432)
        try:
            build(url, args.messages)
            print(f"start, PostgreSQL, {args.messages:,} queued:", flush=True)
            start(url, args.runs)
        finally:
            drop()
    print("write path:", flush=True)
    for kind in ("postgresql", "mysql", "sqlite"):
        d = None
        if kind == "postgresql":
            url, drop = _scratch_pg("127.0.0.1", 5432)
        elif kind == "mysql":
            url, drop = _mysql_db()
        else:
            d = tempfile.mkdtemp(prefix="triomq-totals-")
            url, drop = f"sqlite:///{d}/store.db", (lambda d=d: shutil.rmtree(d, ignore_errors=True))
        try:
            write_cost(kind, url, args.batches, args.batch, args.runs)
        finally:
            drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
