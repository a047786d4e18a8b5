"""SQL store (broker/persistence/sql.py) against real SQLite, PostgreSQL and MariaDB.

Every test gets its own fresh database (CREATE DATABASE triomq_test_<random>,
DROP at the end). A backend whose server is unreachable is skipped with a
message; nothing is mocked.
"""
from __future__ import annotations

import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.exchanges import EXCHANGE_TYPES, Binding
from broker.message import Message
from broker.persistence.base import StoreUnavailable
from broker.persistence.sql import SQLStore, inspect
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue

REPO = Path(__file__).resolve().parents[2]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable

PG_HOST, PG_PORT = "127.0.0.1", 5432
MY_HOST, MY_PORT = "127.0.0.1", 3306


def _reachable(host, port) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _closed_port() -> int:
    return _free_port()  # nothing listens there once the probe socket is closed


# ---------------------------------------------------------------- databases
class PgDB:
    kind = "postgresql"

    def __init__(self):
        import psycopg
        self.psycopg = psycopg
        self.name = "triomq_test_" + secrets.token_hex(6)
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=5) as c:
            c.execute(f'CREATE DATABASE "{self.name}"')
        self.url = f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{self.name}"

    def admin(self, sql: str) -> None:
        with self.psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname="postgres",
                                  autocommit=True, connect_timeout=5) as c:
            c.execute(sql)

    def drop(self):
        self.admin(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')
        self.admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class MyDB:
    kind = "mysql"

    def __init__(self):
        import pymysql
        self.pymysql = pymysql
        self.name = "triomq_test_" + secrets.token_hex(6)
        self.admin(f"CREATE DATABASE `{self.name}`")
        self.url = f"mysql+pymysql://root@{MY_HOST}:{MY_PORT}/{self.name}"

    def admin(self, sql: str):
        c = self.pymysql.connect(host=MY_HOST, port=MY_PORT, user="root", password="",
                                 connect_timeout=5, autocommit=True)
        try:
            with c.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            c.close()

    def drop(self):
        self.admin(f"DROP DATABASE IF EXISTS `{self.name}`")


class LiteDB:
    kind = "sqlite"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="triomq-sql-")
        self.url = f"sqlite:///{self.dir}/store.db"

    def drop(self):
        shutil.rmtree(self.dir, ignore_errors=True)


BACKENDS = ["sqlite", "postgresql", "mysql"]


def _make_db(kind):
    if kind == "sqlite":
        return LiteDB()
    if kind == "postgresql":
        if not _reachable(PG_HOST, PG_PORT):
            pytest.skip(f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT}")
        return PgDB()
    if not _reachable(MY_HOST, MY_PORT):
        pytest.skip(f"MariaDB not reachable on {MY_HOST}:{MY_PORT}")
    return MyDB()


@pytest.fixture(params=BACKENDS)
def db(request):
    d = _make_db(request.param)
    yield d
    d.drop()


@pytest.fixture
def pg():
    d = _make_db("postgresql")
    yield d
    d.drop()


# ------------------------------------------------------------ broker helpers
def props(persistent=True, **extra):
    p = dict(extra)
    if persistent:
        p["delivery_mode"] = 2
    return p


def message(rk: str, body: bytes, persistent=True, **extra) -> Message:
    pr = props(persistent, **extra)
    return Message("", rk, encode_properties(pr), pr, body)


def declare_queue(broker, name, durable=True, arguments=None) -> Queue:
    vhost = broker.vhosts["/"]
    args = arguments or {}
    q = Queue(vhost, name, durable=durable, arguments=args, opts=parse_queue_arguments(args))
    vhost.add_queue(q)
    return q


def take(q):
    """Deliver the head entry the way dispatch does (delivered hook) without a consumer."""
    entry = q.ready.popleft()
    q.ready_bytes -= len(entry.message.body)
    entry.delivery_count += 1
    if q.store is not None and entry.message.persistent:
        q.store.delivered(q, entry)
    q.unacked_count += 1
    return entry


class Running:
    """A Broker with an SQLStore whose run() loop is live in a nursery."""

    def __init__(self, url, flush="sync"):
        self.store = SQLStore(url, flush=flush)
        self.broker = Broker(Config(), self.store)
        self.vhost = self.broker.vhosts["/"]

    async def __aenter__(self):
        await self.store.open()
        self.broker.recover()
        self._nursery_cm = trio.open_nursery()
        self.nursery = await self._nursery_cm.__aenter__()
        self.nursery.start_soon(self.store.run)
        return self

    async def __aexit__(self, *exc):
        self.nursery.cancel_scope.cancel()
        await self._nursery_cm.__aexit__(None, None, None)
        with trio.CancelScope(shield=True):
            await self.store.close()

    async def durable(self, limit: float = 10.0) -> bool:
        """Wait for when_durable; True = confirmed, False = failed."""
        done = trio.Event()
        result = []
        self.store.when_durable(lambda: (result.append(True), done.set()),
                                on_failure=lambda: (result.append(False), done.set()))
        with trio.fail_after(limit):
            await done.wait()
        return result[0]


def run(fn, *args):
    return trio.run(fn, *args)


# ================================================================ store tests
def test_roundtrip_definitions_and_messages(db):
    async def first():
        async with Running(db.url) as r:
            x = EXCHANGE_TYPES["direct"]("ex.d", durable=True, auto_delete=False, internal=False,
                                         arguments={"alternate-exchange": b"ae"})
            r.vhost.exchanges["ex.d"] = x
            r.store.save_exchange(r.vhost, x)
            q = declare_queue(r.broker, "q1", arguments={"x-max-priority": 5})
            declare_queue(r.broker, "transient-q", durable=False)
            b = Binding("ex.d", q, "k1", {"a": 1})
            x.add_binding(b)
            r.store.save_binding(r.vhost, b)
            for i in range(200):
                q.enqueue(message("q1", b"m%d" % i, priority=i % 5))
            for i in range(10):
                q.enqueue(message("q1", b"transient%d" % i, persistent=False))
            assert await r.durable() is True

    async def second():
        async with Running(db.url) as r:
            assert "ex.d" in r.vhost.exchanges
            assert r.vhost.exchanges["ex.d"].arguments == {"alternate-exchange": b"ae"}
            assert "transient-q" not in r.vhost.queues
            q = r.vhost.queues["q1"]
            assert q.arguments == {"x-max-priority": 5}
            assert ("ex.d", Binding("ex.d", q, "k1", {"a": 1}).key) in q.bindings
            bodies = []
            while q.ready:
                e = take(q)
                bodies.append(e.message.body)
                assert e.redelivered is False
            # priority queue: higher priority first, FIFO within one priority
            expected = sorted((b"m%d" % i for i in range(200)),
                              key=lambda b: (-(int(b[1:]) % 5), int(b[1:])))
            assert bodies == expected
    run(first)
    run(second)
    out = inspect(db.url)
    assert "triomq_msgs" in out and "q1" in out and "200 messages" in out


def test_delivered_comes_back_redelivered_acked_never(db):
    async def first():
        async with Running(db.url) as r:
            q = declare_queue(r.broker, "q")
            for i in range(30):
                q.enqueue(message("q", b"%d" % i))
            assert await r.durable()
            taken = [take(q) for _ in range(20)]
            for e in taken[:10]:           # acked
                q.ack(e, None)
            assert await r.durable()      # 10..19 delivered-unacked, 20..29 ready

    async def second():
        async with Running(db.url) as r:
            q = r.vhost.queues["q"]
            got = []
            while q.ready:
                e = take(q)
                got.append((int(e.message.body), e.redelivered))
            assert got == [(i, True) for i in range(10, 20)] + [(i, False) for i in range(20, 30)]
    run(first)
    run(second)


def test_publish_ack_before_flush_writes_nothing_and_still_confirms(db):
    async def main():
        async with Running(db.url) as r:
            q = declare_queue(r.broker, "q")
            assert await r.durable()
            rows_before = r.store.rows_written
            for _i in range(50):
                q.enqueue(message("q", b"x"))
                q.ack(take(q), None)
            assert await r.durable() is True
            assert r.store.rows_written == rows_before  # cancelled in the buffer
        async with Running(db.url) as r:
            assert r.vhost.queues["q"].message_count == 0
    run(main)


def test_ttl_survives_restart(db):
    async def first():
        async with Running(db.url) as r:
            q = declare_queue(r.broker, "q")
            q.enqueue(message("q", b"short", expiration="600"))
            q.enqueue(message("q", b"long", expiration="60000"))
            assert await r.durable()

    async def second():
        async with Running(db.url) as r:
            q = r.vhost.queues["q"]
            await trio.sleep(0.2)
            entries = list(q.ready.clear())
            now = r.vhost.timers.now()
            bodies = {e.message.body: e.expires_at - now for e in entries}
            # the short one expired during the restart pause (deadline in the past)
            assert bodies[b"short"] < 0
            assert 50 < bodies[b"long"] <= 60
    run(first)
    time.sleep(0.8)
    run(second)


def test_queue_delete_and_fanout_gc(db):
    async def main():
        async with Running(db.url) as r:
            q1 = declare_queue(r.broker, "a")
            q2 = declare_queue(r.broker, "b")
            for i in range(20):
                m = message("x", b"%d" % i)
                q1.enqueue(m)
                q2.enqueue(m)
            assert await r.durable()
            r.vhost.delete_queue(q1)
            assert await r.durable()
            # redeclare with the same name: must come back empty
            declare_queue(r.broker, "a")
            assert await r.durable()
        out = inspect(db.url)
        assert "triomq_msgs" in out
        async with Running(db.url) as r:
            assert r.vhost.queues["a"].message_count == 0
            q2 = r.vhost.queues["b"]
            assert q2.message_count == 20
            while q2.ready:
                q2.ack(take(q2), None)
            assert await r.durable()
        counts = {line.split()[0]: line.split()[1] for line in inspect(db.url).splitlines()[1:7]}
        assert counts["triomq_msgs"] == "0" and counts["triomq_entries"] == "0"
    run(main)


def test_second_store_on_same_database_is_refused(db):
    async def main():
        async with Running(db.url):
            other = SQLStore(db.url)
            with pytest.raises(StoreUnavailable) as ei:
                await other.open()
            msg = str(ei.value)
            assert "locked by" in msg and "\n" not in msg
        # released on close: a new broker can take it
        async with Running(db.url):
            pass
    run(main)


@pytest.mark.parametrize("kind", BACKENDS)
def test_unreachable_database_one_clear_line(kind):
    port = _closed_port()
    url = {"postgresql": f"postgresql+psycopg://postgres@127.0.0.1:{port}/x",
           "mysql": f"mysql+pymysql://root@127.0.0.1:{port}/x",
           "sqlite": "sqlite:////nonexistent-dir-triomq/store.db"}[kind]
    store = SQLStore(url)
    with pytest.raises(StoreUnavailable) as ei:
        trio.run(store.open)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("cannot open store")
    assert ("refused" in msg.lower() or "can't connect" in msg.lower()
            or "does not exist" in msg), msg


def test_database_lost_at_run_time_nacks_then_recovers(pg):
    """PostgreSQL: refuse connections to our test database and kill its sessions. The
    write that meets the fault is in doubt (neither confirmed nor nacked, the broker is
    told) and is written again once the database is back; what comes while it is down is
    nacked and never stored."""
    async def main():
        async with Running(pg.url) as r:
            failures = []
            told = r.broker.on_store_failure
            r.broker.on_store_failure = lambda st, why: (failures.append(why), told(st, why))
            q = declare_queue(r.broker, "q")
            q.enqueue(message("q", b"before"))
            assert await r.durable() is True
            pg.admin(f'ALTER DATABASE "{pg.name}" ALLOW_CONNECTIONS false')
            pg.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     f"WHERE datname = '{pg.name}'")
            q.enqueue(message("q", b"in doubt"))
            doubt = []
            r.store.when_durable(lambda: doubt.append(True), lambda: doubt.append(False))
            with trio.fail_after(10):
                while not failures:  # noqa: ASYNC110  (polls the store, no event to wait on)
                    await trio.sleep(0.05)
            assert doubt == [] and r.store._down
            q.enqueue(message("q", b"during"))
            assert await r.durable() is False          # nacked: withdrawn, never stored
            assert [e.message.body for e in q.ready] == [b"before", b"in doubt"]
            pg.admin(f'ALTER DATABASE "{pg.name}" ALLOW_CONNECTIONS true')
            with trio.fail_after(20):
                while r.store._down or not doubt:  # noqa: ASYNC110
                    await trio.sleep(0.1)
            assert doubt == [True]                     # written again once the database is back
            q.enqueue(message("q", b"after"))
            assert await r.durable() is True
        async with Running(pg.url) as r:
            q = r.vhost.queues["q"]
            bodies = [take(q).message.body for _ in range(q.message_count)]
            assert bodies == [b"before", b"in doubt", b"after"]
    run(main)


def test_async_flush_confirms_at_once_and_writes_soon(db):
    async def main():
        async with Running(db.url, flush="async") as r:
            q = declare_queue(r.broker, "q")
            q.enqueue(message("q", b"a"))
            called = []
            r.store.when_durable(lambda: called.append(1))
            assert called == [1]
            await trio.sleep(0.3)
        async with Running(db.url) as r:
            assert r.vhost.queues["q"].message_count == 1
    run(main)


# ============================================================ end to end (pika)
class BrokerProc:
    def __init__(self, url, data_dir):
        self.url = url
        self.data_dir = data_dir
        self.port = _free_port()
        self.proc = None

    def start(self, expect_ok=True):
        self.proc = subprocess.Popen(
            [PY, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(self.port),
             "--data-dir", self.data_dir, "--store", self.url, "--http-port", "0"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not expect_ok:
            return self.proc
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited: {self.proc.stderr.read()}")
            if _reachable("127.0.0.1", self.port):
                return self.proc
            time.sleep(0.1)
        raise AssertionError("broker did not start")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            for s in (self.proc.stdout, self.proc.stderr):
                if s and not s.closed:
                    s.close()


def _pika(port):
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port,
                                                             connection_attempts=3,
                                                             retry_delay=0.5))


@pytest.mark.timeout(120)
def test_end_to_end_kill9_restart(db, tmp_path):
    import pika
    bp = BrokerProc(db.url, str(tmp_path / "data"))
    bp.start()
    try:
        conn = _pika(bp.port)
        ch = conn.channel()
        ch.queue_declare("e2e", durable=True)
        ch.confirm_delivery()
        n = 300
        for i in range(n):
            ch.basic_publish("", "e2e", b"msg-%d" % i,
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
        # three delivered but not acked at the time of the crash
        ch2 = conn.channel()
        ch2.basic_qos(prefetch_count=3)
        seen = []
        for method, _props, body in ch2.consume("e2e", inactivity_timeout=2):
            if method is None:
                break
            seen.append(body)
            if len(seen) == 3:
                break
        time.sleep(0.5)  # let the delivered marks reach the database
        bp.kill9()
        bp.start()
        holder = bp
        conn = _pika(holder.port)
        ch = conn.channel()
        got = []
        for method, _props, body in ch.consume("e2e", inactivity_timeout=3):
            if method is None:
                break
            got.append((body, method.redelivered))
            ch.basic_ack(method.delivery_tag)
        assert [b for b, _ in got] == [b"msg-%d" % i for i in range(n)]
        assert all(r for _b, r in got[:3]) and not any(r for _b, r in got[3:])
        conn.close()
        holder.kill9()
        holder.start()  # acked ones never come back
        conn = _pika(holder.port)
        ch = conn.channel()
        assert ch.queue_declare("e2e", durable=True).method.message_count == 0
        conn.close()
    finally:
        bp.stop()


def test_cli_unreachable_store_exits_with_one_line(tmp_path):
    port = _closed_port()
    bp = BrokerProc(f"postgresql+psycopg://postgres@127.0.0.1:{port}/x", str(tmp_path / "d"))
    p = bp.start(expect_ok=False)
    out, err = p.communicate(timeout=30)
    assert p.returncode != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot open store" in lines[0], err


@pytest.mark.timeout(60)
def test_cli_second_broker_on_same_store_refused(db, tmp_path):
    bp = BrokerProc(db.url, str(tmp_path / "data"))
    bp.start()
    try:
        other = BrokerProc(db.url, str(tmp_path / "data2"))
        p = other.start(expect_ok=False)
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "locked by" in lines[0], err
    finally:
        bp.stop()


def test_cli_inspect_lists_live_messages_per_queue(db):
    async def main():
        async with Running(db.url) as r:
            q = declare_queue(r.broker, "insp")
            for _ in range(7):
                q.enqueue(message("insp", b"x" * 10))
            assert await r.durable()
    run(main)
    out = subprocess.run([PY, "-m", "broker", "inspect", "--store", db.url], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "triomq_entries" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if " insp " in ln)
    assert "7 messages" in line


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_killed_connections_reconnect_and_retake_lock(kind):
    d = _make_db(kind)

    def kill_sessions():
        if kind == "postgresql":
            d.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{d.name}'")
        else:
            for (cid,) in d.admin(f"SELECT id FROM information_schema.processlist "
                                  f"WHERE db = '{d.name}'"):
                try:
                    d.admin(f"KILL {int(cid)}")
                except Exception:
                    pass

    async def main():
        async with Running(d.url) as r:
            q = declare_queue(r.broker, "q")
            q.enqueue(message("q", b"before"))
            assert await r.durable() is True
            kill_sessions()
            q.enqueue(message("q", b"maybe"))
            await r.durable()            # nacked (connection gone) or acked after a reconnect
            with trio.fail_after(20):
                while True:
                    q.enqueue(message("q", b"after"))
                    if await r.durable():
                        break
                    await trio.sleep(0.2)
            # the lock is held again: a second store is refused
            other = SQLStore(d.url)
            with pytest.raises(StoreUnavailable, match="locked by"):
                await other.open()
        async with Running(d.url) as r:
            bodies = [e.message.body for e in r.vhost.queues["q"].ready.clear()]
            assert bodies[0] == b"before" and bodies[-1] == b"after"
    try:
        run(main)
    finally:
        d.drop()
