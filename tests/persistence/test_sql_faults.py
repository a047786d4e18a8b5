"""The SQL store under database faults (issue 15), against the REAL PostgreSQL and MariaDB.

A broker subprocess reaches the database through ``faultproxy.FaultProxy`` (blackhole,
reset, refuse); a pika publisher with confirms records which ids were confirmed, nacked
or in doubt. After the fault, every confirmed id must come back, no nacked id ever does,
and the broker recovers by itself (it never locks itself out). The lease tests run a
second broker with ``--sql-standby``. Timings are short (lease 3 s, renew 0.5 s,
timeouts 1.5 s); the figures printed (``-s``) are those of docs/performance-sql.md.
"""
from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy
import trio

from broker.config import Config, SQLSettings
from broker.persistence import sql_schema as S
from broker.persistence.sql import SQLStore

from .faultproxy import FaultProxy
from .test_sql_store import MY_HOST, MY_PORT, PG_HOST, PG_PORT, BrokerProc, _make_db, _reachable

LEASE, RENEW, TIMEOUT = 3.0, 0.5, 1.5
SQL_ARGS = ["--sql-lease", str(LEASE), "--sql-renew", str(RENEW), "--sql-timeout", str(TIMEOUT)]
TARGET = {"postgresql": (PG_HOST, PG_PORT), "mysql": (MY_HOST, MY_PORT)}


def _via(url: str, kind: str, port: int) -> str:
    host, real = TARGET[kind]
    return url.replace(f"{host}:{real}", f"127.0.0.1:{port}")


class Broker(BrokerProc):
    """``BrokerProc`` with the short SQL settings, its log in a file (never a full pipe)."""

    def __init__(self, url, data_dir, log_path, extra=()):
        super().__init__(url, data_dir)
        self.log_path = log_path
        self.extra = list(extra)

    def start(self, expect_ok=True, wait=30.0):
        import subprocess

        from .test_sql_store import PY, REPO
        self.log = open(self.log_path, "a")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [PY, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(self.port),
             "--data-dir", self.data_dir, "--store", self.url, "--http-port", "0", *SQL_ARGS,
             *self.extra],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        if expect_ok:
            self.wait_listening(wait)
        return self.proc

    def wait_listening(self, wait: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited: {self.text()}")
            if _reachable("127.0.0.1", self.port):
                return time.monotonic()
            time.sleep(0.05)
        raise AssertionError(f"broker did not start: {self.text()}")

    def text(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def kill9(self):
        import signal
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()


def _connect(port):
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, connection_attempts=3, retry_delay=0.3, heartbeat=0))


class Publisher(threading.Thread):
    """Publishes persistent messages "0", "1", … with confirms, one at a time. A connection
    closed while a publish waits for its confirm makes that id in doubt (the broker could
    not tell whether it was stored); the publisher then reconnects and goes on."""

    def __init__(self, port, queue="q"):
        super().__init__(daemon=True)
        self.port = port
        self.queue = queue
        self.confirmed: dict[int, float] = {}  # id -> monotonic time of the confirm
        self.nacked: dict[int, float] = {}
        self.doubted: dict[int, float] = {}
        self.refused = 0  # connection attempts refused (a fenced or stopped broker)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.n = 0

    @property
    def in_doubt(self) -> set[int]:
        return set(self.doubted)

    def _channel(self):
        """A confirm channel on a new connection, retried while the broker refuses them
        (fenced: its lease ran out); None once stopped."""
        import pika
        while not self.stop_event.is_set():
            try:
                conn = _connect(self.port)
                ch = conn.channel()
                ch.confirm_delivery()
                return conn, ch
            except pika.exceptions.AMQPError:
                self.refused += 1
                time.sleep(0.1)
        return None, None

    def run(self):
        import pika
        try:
            conn, ch = self._channel()
            props = pika.BasicProperties(delivery_mode=2)
            while ch is not None and not self.stop_event.is_set():
                i = self.n
                self.n += 1
                try:
                    ch.basic_publish("", self.queue, str(i).encode(), props)
                    self.confirmed[i] = time.monotonic()
                except pika.exceptions.NackError:
                    self.nacked[i] = time.monotonic()
                except pika.exceptions.AMQPError:
                    self.doubted[i] = time.monotonic()
                    if not conn.is_closed:
                        conn.close()
                    conn, ch = self._channel()
                time.sleep(0.005)
            if conn is not None and conn.is_open:
                conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self):
        self.stop_event.set()
        self.join(30)
        assert self.error is None, repr(self.error)

    def first(self, what, after: float, timeout: float) -> float:
        """When the first id of ``what`` (a dict of ids, e.g. confirmed, or a tuple of such
        dicts) after ``after`` was decided."""
        dicts = what if isinstance(what, tuple) else (what,)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [t for d in dicts for t in list(d.values()) if t > after]
            if hits:
                return min(hits)
            time.sleep(0.02)
        raise AssertionError("nothing decided in time")


def _declare(port, queue="q"):
    conn = _connect(port)
    conn.channel().queue_declare(queue, durable=True)
    conn.close()


def _drain(port, queue="q") -> list[int]:
    return [int(body) for body in _drain_bodies(port, queue)]


def _check(pub: Publisher, consumed: list[int]) -> None:
    got = set(consumed)
    assert len(got) == len(consumed), "a message came back twice"
    lost = set(pub.confirmed) - got
    assert not lost, f"confirmed but lost: {sorted(lost)[:10]}"
    leaked = got & set(pub.nacked)
    assert not leaked, f"nacked but delivered: {sorted(leaked)[:10]}"
    assert got <= set(pub.confirmed) | pub.in_doubt


@pytest.fixture
def env(request, tmp_path):
    made = []

    def make(kind):
        db = _make_db(kind)
        proxy = FaultProxy(*TARGET[kind]).start()
        made.append((db, proxy))
        return db, proxy
    brokers: list[Broker] = []

    def broker(url, name="a", extra=()):
        b = Broker(url, str(tmp_path / name), str(tmp_path / f"{name}.log"), extra)
        brokers.append(b)
        return b
    yield make, broker
    for b in brokers:
        b.stop()
    for db, proxy in made:
        proxy.stop()
        db.drop()


# ------------------------------------------------------------ outages
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
@pytest.mark.parametrize("fault", ["blackhole", "reset"])
def test_outage_confirmed_kept_nacked_gone(env, kind, fault):
    """Publish through an outage: nothing confirmed is lost, nothing nacked is delivered
    (during or after it), and the broker resumes by itself once the database answers."""
    make, broker = env
    db, proxy = make(kind)
    a = broker(_via(db.url, kind, proxy.port))
    a.start()
    _declare(a.port)
    pub = Publisher(a.port)
    pub.start()
    time.sleep(1.0)
    t_fault = time.monotonic()
    if fault == "blackhole":
        proxy.blackhole()  # longer than the lease: the broker must get its own lease back
        hold = LEASE + 2
    else:
        proxy.close_all()
        proxy.refuse()
        hold = 2.0
    detect = pub.first((pub.nacked, pub.doubted), t_fault, 15) - t_fault
    time.sleep(max(0.0, t_fault + hold - time.monotonic()))
    t_resume = time.monotonic()
    proxy.resume()
    recover = pub.first(pub.confirmed, t_resume, 20) - t_resume
    time.sleep(0.5)
    pub.finish()
    print(f"\n[{kind} {fault}] detect {detect:.2f} s, recover {recover:.2f} s after resume; "
          f"{len(pub.confirmed)} confirmed, {len(pub.nacked)} nacked, {len(pub.in_doubt)} in doubt")
    assert detect <= TIMEOUT + 1.0
    assert recover <= TIMEOUT + 3.0
    assert pub.nacked, "the outage nacked nothing"
    if fault == "blackhole":  # longer than the lease: fenced (clients refused), then back
        assert "not serving until it is renewed" in a.text() and "serving again" in a.text()
    # what the database holds: kill -9, restart on the database directly
    a.kill9()
    b = broker(db.url, "b")
    b.start()
    _check(pub, _drain(b.port))


# ------------------------------------------------------------ lease
@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_standby_waits_then_takes_over_a_silent_master(env, kind):
    """A second broker cannot take the lease while the first renews it; when the first
    goes silent it takes over after the lease, and the deposed first never confirms
    again (it stopped before the standby started)."""
    make, broker = env
    db, proxy = make(kind)
    a = broker(_via(db.url, kind, proxy.port))
    a.start()
    _declare(a.port)
    second = broker(db.url, "second")
    second.start(expect_ok=False)
    assert second.proc.wait(15) != 0
    assert "is locked by" in second.text()
    b = broker(db.url, "b", ["--sql-standby"])
    b.start(expect_ok=False)
    # the takeover is timed from the fault: the standby must be waiting by then (its
    # start-up alone can outlast the lease on a loaded machine)
    _wait_standby(b)
    pub = Publisher(a.port)
    pub.start()
    time.sleep(2 * LEASE)  # several renewals: the standby keeps waiting
    assert not _reachable("127.0.0.1", b.port) and b.proc.poll() is None
    t_fault = time.monotonic()
    proxy.blackhole()
    t_up = b.wait_listening(LEASE + 10)
    takeover = t_up - t_fault
    last_ok = max(pub.confirmed.values())
    proxy.resume()  # the deposed master reaches the database again: it must not write
    time.sleep(1.5)
    pub.finish()
    print(f"\n[{kind}] lease takeover of a silent master after {takeover:.2f} s "
          f"(lease {LEASE} s); its last confirm {last_ok - t_fault:.2f} s after the fault")
    # the lower bound is the guarantee; the upper one a hang guard (the test polls)
    assert LEASE - 0.5 <= takeover <= LEASE + RENEW + TIMEOUT + 6
    assert last_ok < t_fault + LEASE, "the deposed master confirmed after its lease"
    assert all(t < t_up for t in pub.confirmed.values())
    # fenced before the standby started: its connections closed, new ones refused
    assert "lease ran out" in a.text() and "not serving until it is renewed" in a.text()
    fenced_at = max(pub.doubted.values(), default=t_fault)
    assert fenced_at < t_up
    # back in reach of the database, it finds the lease taken over and stops
    assert a.proc.wait(LEASE + 10) == 1
    assert "taken over" in a.text() and "stopped serving" in a.text()
    _check(pub, _drain(b.port))


@pytest.mark.timeout(60)
def test_standby_takes_over_after_kill9(env):
    make, broker = env
    db, _proxy = make("postgresql")
    a = broker(db.url)
    a.start()
    _declare(a.port)
    pub = Publisher(a.port)
    pub.start()
    b = broker(db.url, "b", ["--sql-standby"])
    b.start(expect_ok=False)
    # the takeover is timed from the kill: the standby must be waiting by then (its start-up
    # alone, imports included, took longer than the lease on a loaded machine)
    _wait_standby(b)
    pub.stop_event.set()
    pub.join(10)
    t_kill = time.monotonic()
    a.kill9()
    takeover = b.wait_listening(LEASE + 10) - t_kill
    print(f"\n[postgresql] standby took over {takeover:.2f} s after kill -9 of the master")
    assert takeover <= LEASE + RENEW + 1
    _check(pub, _drain(b.port))


def _wait_standby(b: Broker, guard: float = 40.0) -> None:
    """Until ``b`` found the lease held and waits for it (a hang guard, not a timing)."""
    deadline = time.monotonic() + guard
    while "is locked by" not in b.text():
        assert b.proc.poll() is None and time.monotonic() < deadline, b.text()
        time.sleep(0.05)


def test_lease_owner_renewed_and_released(env):
    """The lock row holds the owner and an expiry in the future while running; a clean
    stop releases it so the next broker starts at once."""
    make, broker = env
    db, _proxy = make("postgresql")
    a = broker(db.url)
    a.start()
    # the broker listens before it opens its store: once a connection is served, it has
    # the lease (a fixed wait was too short for the start-up on a loaded machine)
    _declare(a.port)
    time.sleep(RENEW * 3)
    import psycopg
    dbname = db.url.rsplit("/", 1)[1]
    with psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname=dbname) as c:
        owner, expires = c.execute("SELECT owner, expires_at FROM triomq_lock").fetchone()
        assert owner.startswith("triomq ") and expires > time.time()
        a.stop()
        owner, expires = c.execute("SELECT owner, expires_at FROM triomq_lock").fetchone()
        assert owner is None and expires is None
    # not a standby: had the lease still been held it would have exited "is locked by"
    # (timing its start measured the interpreter's start-up on a loaded machine instead)
    b = broker(db.url, "b")
    b.start()
    _declare(b.port)
    assert "is locked by" not in b.text()


def test_schema_v1_database_is_migrated(tmp_path):
    """A version-1 database (no triomq_lock.expires_at) opens and gets the column."""
    url = f"sqlite:///{tmp_path}/store.db"

    async def main():
        st = SQLStore(url, settings=SQLSettings(lease=LEASE, renew=RENEW, timeout=TIMEOUT))
        await st.open()
        await st.close()
        import sqlite3
        c = sqlite3.connect(f"{tmp_path}/store.db")
        c.execute("ALTER TABLE triomq_lock DROP COLUMN expires_at")
        c.execute("UPDATE triomq_lock SET schema_version = 1")
        c.commit()
        c.close()
        st = SQLStore(url)
        await st.open()
        await st.close()
        c = sqlite3.connect(f"{tmp_path}/store.db")
        cols = [r[1] for r in c.execute("PRAGMA table_info(triomq_lock)")]
        version = c.execute("SELECT schema_version FROM triomq_lock").fetchone()[0]
        c.close()
        assert "expires_at" in cols and version == S.SCHEMA_VERSION
    trio.run(main)


# ------------------------------------------------------------ memory during an outage
def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class BulkPublisher(threading.Thread):
    """Persistent 200 KB messages without confirms, as fast as the broker reads them (a
    blocked connection stops it in its socket write: pika's blocking adapter does not read
    connection.blocked while it waits to write)."""

    def __init__(self, port, size=200 * 1024):
        super().__init__(daemon=True)
        self.port, self.size = port, size
        self.sent = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        import pika
        try:
            conn = _connect(self.port)
            ch = conn.channel()
            props = pika.BasicProperties(delivery_mode=2)
            pad = b"x" * self.size
            while not self.stop_event.is_set():
                ch.basic_publish("", "q", str(self.sent).encode() + b" " + pad, props)
                self.sent += 1
            conn.close()  # close-ok: every publish before it was taken by the broker
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_long_outage_blocks_publishers_at_the_memory_bound(env, kind):
    """Publishes without confirms go on through an outage: the broker holds each body once,
    blocks the publisher (connection.blocked, socket no longer read) when the unwritten
    bytes reach --sql-max-unwritten, writes the backlog in bounded transactions when the
    database is back, and gives the memory back after the drain. Nothing is lost.

    After the drain the broker keeps up to ``Config.free_heap_kept`` (32 MiB) of freed heap
    by design (its periodic check trims only beyond that): measured under load, 31 MB free
    in malloc and untrimmed, RSS 30 MB above the start. So the after-drain bound is that
    plus 30 MB, and the backlog (the unwritten bound) is made larger than the bound, so
    that bodies kept after the drain would still show."""
    bound = 64 << 20
    make, broker = env
    db, proxy = make(kind)
    # a lease longer than the outage: the broker stays unfenced and keeps its publisher.
    # The database refuses (found at once), so no short statement timeout is needed: the
    # suite's 1.5 s one failed writes of the 8 MiB backlog transactions on a loaded machine
    a = broker(_via(db.url, kind, proxy.port),
               extra=["--sql-max-unwritten", str(bound), "--sql-lease", "30",
                      "--sql-timeout", "10"])
    a.start()
    _declare(a.port)
    rss0 = _rss_mb(a.proc.pid)
    proxy.close_all()
    proxy.refuse()
    pub = BulkPublisher(a.port)
    pub.start()
    peak = rss0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "resource alarm set: memory" not in a.text():
        peak = max(peak, _rss_mb(a.proc.pid))
        time.sleep(0.05)
    assert "publishers are blocked" in a.text(), f"never blocked ({pub.sent} sent)"
    for _ in range(40):  # blocked: the count stops, memory stays at the bound
        sent = pub.sent
        peak = max(peak, _rss_mb(a.proc.pid))
        time.sleep(0.05)
    time.sleep(1.0)
    held = pub.sent
    assert pub.sent - sent <= 40, "the publisher was not held back"
    peak = max(peak, _rss_mb(a.proc.pid))
    t_resume = time.monotonic()
    proxy.resume()
    pub.stop_event.set()
    pub.join(60)
    assert pub.error is None, repr(pub.error)
    # a confirmed publish after the backlog: every earlier write is committed before it
    conn = _connect(a.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"end", pika_props())
    conn.close()
    written = time.monotonic() - t_resume
    engine = sqlalchemy.create_engine(db.url, poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as c:
        stored = c.execute(sqlalchemy.text("SELECT count(*) FROM triomq_entries")).scalar()
    assert stored == pub.sent + 1, "the database does not hold the whole backlog"
    consumed = _drain_bodies(a.port)
    time.sleep(2.5)  # the broker's periodic check gives free heap back
    after = _rss_mb(a.proc.pid)
    print(f"\n[{kind}] outage backlog: blocked after {held} x 200 KB; RSS {rss0:.0f} MB -> "
          f"peak {peak:.0f} MB (bound {bound >> 20} MB), after the drain {after:.0f} MB; "
          f"{pub.sent} published, backlog written {written:.1f} s after the database returned")
    # the bodies held once, plus what one transaction in flight encodes, plus the driver
    assert peak - rss0 <= (bound >> 20) * 2 + 2 * (SQLSettings.batch_bytes >> 20) + 30
    assert after - rss0 <= (Config.free_heap_kept >> 20) + 30 < bound >> 20
    ids = [int(b.split(b" ", 1)[0]) for b in consumed if b != b"end"]
    assert sorted(ids) == list(range(pub.sent)) and consumed[-1] == b"end"


def pika_props():
    import pika
    return pika.BasicProperties(delivery_mode=2)


def _drain_bodies(port, queue="q") -> list[bytes]:
    conn = _connect(port)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    conn.close()
    return got
