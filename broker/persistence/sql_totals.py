"""Per-queue totals of the SQL store's entry index (``triomq_totals``), kept by the database
itself: triggers on ``triomq_entries`` add what each INSERT adds and take away what each
DELETE removes, in the same transaction. A start then reads one row per queue instead of
grouping every stored entry (the ``GROUP BY`` grew with the backlog: about 0.5 s at 1M).

Counting in the database, not in the store's batches, keeps the totals exact whatever
writes the entries: a batch written again after an in-doubt commit (its inserts are
ignored, its deletes find nothing: the triggers see no row), a batch split record by
record, a purge by seq range, a queue's delete, the clean-up of orphaned entries, an
operator's TRUNCATE (its own trigger: it fires no DELETE trigger). A transaction rolled back
takes the triggers' writes with it.

PostgreSQL only: statement-level triggers over transition tables (one aggregate per
statement, not per row), which cost no measurable time per entry written. MariaDB and SQLite
have only row triggers: one upsert of the totals row per entry doubled MariaDB's cost per
entry inserted and deleted (+70 us) and added half to SQLite's (+15 us), so they keep
grouping the entries at start, as any other dialect does (``kept`` is False). ``top_seq``
is the highest seq ever inserted for the queue while it had a totals row (an upper bound of
the stored seqs: the index is read by ranges up to it)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .sql_schema import entries, totals

TRIGGERS = ("triomq_entries_totals_ins", "triomq_entries_totals_del", "triomq_entries_totals_trunc")

_PG = (
    """CREATE OR REPLACE FUNCTION triomq_totals_ins() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO triomq_totals AS t (qid, entries, top_seq, nbytes, unsized, expiring)
        SELECT qid, COUNT(*), MAX(seq), COALESCE(SUM(size), 0), COUNT(*) - COUNT(size),
               COUNT(expires_at) FROM new_rows GROUP BY qid
      ON CONFLICT (qid) DO UPDATE SET entries = t.entries + excluded.entries,
        top_seq = GREATEST(t.top_seq, excluded.top_seq), nbytes = t.nbytes + excluded.nbytes,
        unsized = t.unsized + excluded.unsized, expiring = t.expiring + excluded.expiring;
      RETURN NULL;
    END $$""",
    """CREATE OR REPLACE FUNCTION triomq_totals_del() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE triomq_totals AS t SET entries = t.entries - d.n, nbytes = t.nbytes - d.b,
             unsized = t.unsized - d.u, expiring = t.expiring - d.x
        FROM (SELECT qid, COUNT(*) AS n, COALESCE(SUM(size), 0) AS b,
                     COUNT(*) - COUNT(size) AS u, COUNT(expires_at) AS x
              FROM old_rows GROUP BY qid) AS d
       WHERE t.qid = d.qid;
      RETURN NULL;
    END $$""",
    """CREATE OR REPLACE FUNCTION triomq_totals_trunc() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      DELETE FROM triomq_totals;
      RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS triomq_entries_totals_ins ON triomq_entries",
    "DROP TRIGGER IF EXISTS triomq_entries_totals_del ON triomq_entries",
    "DROP TRIGGER IF EXISTS triomq_entries_totals_trunc ON triomq_entries",
    """CREATE TRIGGER triomq_entries_totals_ins AFTER INSERT ON triomq_entries
       REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION triomq_totals_ins()""",
    """CREATE TRIGGER triomq_entries_totals_del AFTER DELETE ON triomq_entries
       REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION triomq_totals_del()""",
    # a TRUNCATE (an operator's) fires no DELETE trigger: every total goes with the rows
    """CREATE TRIGGER triomq_entries_totals_trunc AFTER TRUNCATE ON triomq_entries
       FOR EACH STATEMENT EXECUTE FUNCTION triomq_totals_trunc()""",
)

_DDL = {"postgresql": _PG}

_PRESENT = {
    "postgresql": "SELECT COUNT(*) FROM pg_trigger WHERE NOT tgisinternal AND tgname IN "
                  "('triomq_entries_totals_ins', 'triomq_entries_totals_del', "
                  "'triomq_entries_totals_trunc') "
                  "AND tgrelid = 'triomq_entries'::regclass",
}

# each queue's totals, as the triggers keep them, counted from its rows
_REBUILD = (f"INSERT INTO {totals.name} (qid, entries, top_seq, nbytes, unsized, expiring) "
            f"SELECT qid, COUNT(*), MAX(seq), COALESCE(SUM(size), 0), COUNT(*) - COUNT(size), "
            f"COUNT(expires_at) FROM {entries.name} GROUP BY qid")


def kept(dialect: str) -> bool:
    """Whether the store keeps ``triomq_totals`` on this dialect."""
    return dialect in _DDL


def installed(conn: Connection, dialect: str) -> bool:
    """The triggers are there (both)."""
    present: bool = conn.execute(text(_PRESENT[dialect])).scalar() == len(TRIGGERS)
    return present


def install(conn: Connection, dialect: str) -> None:
    """Create the triggers and compute the totals from the stored rows, once (a database an
    older version wrote, or a new one), in the caller's transaction: it holds
    ``triomq_entries`` locked against writes from the triggers' creation to the commit, so
    no write (a master's, while a standby opens) is counted twice or missed. That lock is
    taken first: another process installing at the same time (workers, a standby) waits
    here, then finds the triggers there, instead of failing in CREATE OR REPLACE FUNCTION
    ('tuple concurrently updated')."""
    conn.execute(text(f"LOCK TABLE {entries.name} IN SHARE ROW EXCLUSIVE MODE"))
    if installed(conn, dialect):
        return
    for sql in _DDL[dialect]:
        conn.execute(text(sql))
    conn.execute(text(f"DELETE FROM {totals.name}"))
    conn.execute(text(_REBUILD))
