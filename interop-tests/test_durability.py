"""Durability: restarts, kill -9, recovery of damaged journals.

Each test starts its own TrioMQ subprocess with a --data-dir and --store so it
can stop, kill and restart it. Parametrized over store URLs: the journal and
the SQL backends (skipped with a reason when broker.persistence.sql does not
import or the database server is unreachable).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pika
import pytest
from brokerproc import BrokerProc

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------ store URLs
def _sql_importable() -> str | None:
    try:
        import broker.persistence.sql  # noqa: F401
    except Exception as exc:
        return f"broker.persistence.sql does not import yet ({type(exc).__name__}: {exc})"
    return None


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(params=["journal", "sqlite", "postgresql", "mysql"])
def store_url(request, tmp_path):
    kind = request.param
    if kind == "journal":
        yield "journal"
        return
    why = _sql_importable()
    if why:
        pytest.skip(why)
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
        return
    db = "triomq_dur_" + uuid.uuid4().hex[:12]
    if kind == "postgresql":
        if not _reachable(5432):
            pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
        import psycopg
        try:
            with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres",
                                 autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{db}"')
        except Exception as exc:
            pytest.skip(f"cannot create a PostgreSQL database: {exc}")
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
        try:
            with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres",
                                 autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        except Exception:
            pass
        return
    if kind == "mysql":
        if not _reachable(3306):
            pytest.skip("MySQL/MariaDB is not reachable on 127.0.0.1:3306")
        import pymysql
        try:
            c = pymysql.connect(host="127.0.0.1", port=3306, user="root")
            with c.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{db}`")
            c.close()
        except Exception as exc:
            pytest.skip(f"cannot create a MySQL database: {exc}")
        yield f"mysql+pymysql://root@127.0.0.1:3306/{db}"
        try:
            c = pymysql.connect(host="127.0.0.1", port=3306, user="root")
            with c.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
            c.close()
        except Exception:
            pass


# ------------------------------------------------------------------ broker process
@pytest.fixture
def broker(tmp_path, store_url):
    b = BrokerProc(tmp_path / "data", store_url)
    b.start()
    yield b
    b.stop()


def _count(b: BrokerProc, queue: str) -> int:
    c = b.connect()
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        c.close()


def _exists(b: BrokerProc, kind: str, name: str) -> bool:
    c = b.connect()
    ch = c.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if c.is_open:
            c.close()


def _publish(b: BrokerProc, queue: str, bodies, props=PERSISTENT, exchange="", **qargs):
    c = b.connect()
    ch = c.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, queue, body, props)
    c.close()


def _drain(b: BrokerProc, queue: str, ack: bool = True, limit: int | None = None):
    c = b.connect()
    ch = c.channel()
    out = []
    while limit is None or len(out) < limit:
        m, props, body = ch.basic_get(queue, auto_ack=ack)
        if m is None:
            break
        out.append((body, m.redelivered, props))
    c.close()
    return out


# ------------------------------------------------------------------ definitions
def test_durable_definitions_survive_restart_non_durable_do_not(broker):
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare("dur.x", "topic", durable=True)
    ch.exchange_declare("tmp.x", "fanout", durable=False)
    ch.queue_declare("dur.q", durable=True, arguments={"x-max-length": 100})
    ch.queue_declare("tmp.q", durable=False)
    ch.queue_declare("dur.gone", durable=True)
    ch.queue_bind("dur.q", "dur.x", "a.*")
    ch.exchange_declare("dur.x2", "direct", durable=True)
    ch.exchange_bind("dur.x2", "dur.x", "e2e.#")
    ch.queue_declare("dur.q2", durable=True)
    ch.queue_bind("dur.q2", "dur.x2", "e2e.k")
    ch.queue_delete("dur.gone")
    c.close()
    broker.restart()
    assert _exists(broker, "exchange", "dur.x")
    assert _exists(broker, "queue", "dur.q")
    assert not _exists(broker, "exchange", "tmp.x")
    assert not _exists(broker, "queue", "tmp.q")
    assert not _exists(broker, "queue", "dur.gone")
    # bindings work after restart (queue and exchange-to-exchange)
    _publish(broker, "a.b", [b"via-binding"], exchange="dur.x")
    _publish(broker, "e2e.k", [b"via-e2e"], exchange="dur.x")
    assert [m[0] for m in _drain(broker, "dur.q")] == [b"via-binding"]
    assert [m[0] for m in _drain(broker, "dur.q2")] == [b"via-e2e"]
    # queue arguments survived: redeclare with the same arguments is accepted
    c = broker.connect()
    c.channel().queue_declare("dur.q", durable=True, arguments={"x-max-length": 100})
    c.close()


def test_unbind_and_exchange_delete_survive_restart(broker):
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare("ux", "direct", durable=True)
    ch.exchange_declare("ux.gone", "direct", durable=True)
    ch.queue_declare("uq", durable=True)
    ch.queue_bind("uq", "ux", "k1")
    ch.queue_bind("uq", "ux", "k2")
    ch.queue_unbind("uq", "ux", "k1")
    ch.exchange_delete("ux.gone")
    c.close()
    broker.restart()
    assert not _exists(broker, "exchange", "ux.gone")
    _publish(broker, "k1", [b"one"], exchange="ux")
    _publish(broker, "k2", [b"two"], exchange="ux")
    assert [m[0] for m in _drain(broker, "uq")] == [b"two"]


# ------------------------------------------------------------------ messages
@pytest.mark.parametrize("hard", [False, True], ids=["clean", "kill9"])
def test_persistent_messages_survive_transient_do_not(broker, hard):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("pq", durable=True)
    ch.queue_declare("tq", durable=False)
    c.close()
    _publish(broker, "pq", [b"p%d" % i for i in range(50)])
    _publish(broker, "pq", [b"t%d" % i for i in range(10)], props=TRANSIENT)
    _publish(broker, "tq", [b"x"])
    broker.restart(hard=hard)
    got = _drain(broker, "pq")
    assert [m[0] for m in got] == [b"p%d" % i for i in range(50)]
    assert not any(m[1] for m in got)
    assert not _exists(broker, "queue", "tq")


def test_message_routed_to_several_queues_survives(broker):
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare("fan", "fanout", durable=True)
    for q in ("f1", "f2", "f3"):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, "fan")
    c.close()
    _publish(broker, "", [b"m%d" % i for i in range(20)], exchange="fan")
    _drain(broker, "f2")
    time.sleep(0.5)  # acks are written by the next group commit, not confirmed
    broker.restart(hard=True)
    assert len(_drain(broker, "f1")) == 20
    assert _count(broker, "f2") == 0
    got = _drain(broker, "f3")
    assert [m[0] for m in got] == [b"m%d" % i for i in range(20)]
    assert got[0][2].delivery_mode == 2


PUBLISHER = textwrap.dedent("""
    import sys, pika
    port, queue, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    ch.confirm_delivery()
    with open(out, "a", buffering=1) as f:
        i = 0
        while True:
            i += 1
            try:
                ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
            except Exception as exc:
                print("stopped:", type(exc).__name__, file=sys.stderr)
                break
            f.write(f"{i}\\n")
""")


def test_kill9_during_confirmed_publish_stream(broker, tmp_path):
    c = broker.connect()
    c.channel().queue_declare("stream", durable=True)
    c.close()
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    confirmed_file = tmp_path / "confirmed.txt"
    pub = subprocess.Popen([sys.executable, str(script), str(broker.port), "stream",
                            str(confirmed_file)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if confirmed_file.exists() and len(confirmed_file.read_text().split()) > 300:
                break
        broker.kill()
        pub.wait(30)
    finally:
        if pub.poll() is None:
            pub.kill()
            pub.wait()
    confirmed = [int(x) for x in confirmed_file.read_text().split()]
    assert len(confirmed) > 300
    broker.start()
    got = [int(m[0]) for m in _drain(broker, "stream")]
    missing = set(confirmed) - set(got)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:10]}"
    assert got == sorted(got), "queue order changed"


def test_unacked_come_back_redelivered_acked_never(broker):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("ua", durable=True)
    c.close()
    _publish(broker, "ua", [b"m%d" % i for i in range(10)])
    c = broker.connect()
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume("ua", lambda _c, m, p, b: got.append((m.delivery_tag, b)))
    while len(got) < 10:
        c.process_data_events(0.1)
    for tag, _body in got[:5]:
        ch.basic_ack(tag)
    c.process_data_events(0.5)
    time.sleep(0.5)  # the acks are written (not confirmed) by the next group commit
    broker.kill()  # consumer still holds m5..m9 unacked
    broker.start()
    after = _drain(broker, "ua")
    assert [m[0] for m in after] == [b"m%d" % i for i in range(5, 10)]
    assert all(m[1] for m in after), "unacked-at-crash must come back with redelivered=true"
    # and they stay gone once acked (clean restart this time)
    broker.restart()
    assert _count(broker, "ua") == 0


def test_basic_get_unacked_comes_back_redelivered(broker):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("getq", durable=True)
    c.close()
    _publish(broker, "getq", [b"g1", b"g2"])
    c = broker.connect()
    ch = c.channel()
    m, _p, body = ch.basic_get("getq", auto_ack=False)
    assert body == b"g1" and not m.redelivered
    time.sleep(0.5)
    broker.kill()  # g1 is unacked at the crash
    broker.start()
    got = _drain(broker, "getq")
    assert [(b, r) for b, r, _p in got] == [(b"g1", True), (b"g2", False)]


def test_consumer_order_after_restart(broker):
    c = broker.connect()
    c.channel().queue_declare("order", durable=True)
    c.close()
    _publish(broker, "order", [b"%d" % i for i in range(300)])
    broker.restart(hard=True)
    c = broker.connect()
    ch = c.channel()
    got = []
    ch.basic_consume("order", lambda _c, m, p, b: (got.append(int(b)), _c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + 20
    while len(got) < 300 and time.monotonic() < deadline:
        c.process_data_events(0.1)
    c.close()
    assert got == list(range(300))


TTL_MS = 5000  # long enough that a restart on a quiet machine fits well inside it


def test_ttl_after_restart(broker):
    """Expiry is absolute, as RabbitMQ's: a message kept across a restart still expires at
    publish time + TTL (the time the broker was down counts). The deadlines come from the
    test's own clock around the publishes, never from how long the restart took:
    before ``published + TTL`` the messages must be there, after ``confirmed + TTL`` a
    basic.get (which checks expiry itself, not waiting for the queue's timer) must not
    see them. A broker that restarted the TTL at recovery keeps them past that point."""
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("ttlq", durable=True, arguments={"x-message-ttl": TTL_MS})
    ch.queue_declare("ttlq2", durable=True)
    ch.queue_declare("ttlq_long", durable=True, arguments={"x-message-ttl": 3_600_000})
    c.close()
    published = time.time()
    _publish(broker, "ttlq", [b"a", b"b"])
    _publish(broker, "ttlq2", [b"short"], props=pika.BasicProperties(delivery_mode=2,
                                                                        expiration=str(TTL_MS)))
    _publish(broker, "ttlq2", [b"long"])
    _publish(broker, "ttlq_long", [b"kept"])
    confirmed = time.time()
    broker.restart()
    # kept across the restart (this one whatever the restart took)
    assert _count(broker, "ttlq_long") == 1
    counts = (_count(broker, "ttlq"), _count(broker, "ttlq2"))
    if time.time() < published + TTL_MS / 1000:  # asked before any of them could expire
        assert counts == (2, 2), "messages dropped before their TTL ran out"
    time.sleep(max(0.0, confirmed + TTL_MS / 1000 + 0.05 - time.time()))
    assert [m[0] for m in _drain(broker, "ttlq")] == []
    assert [m[0] for m in _drain(broker, "ttlq2")] == [b"long"]
    assert [m[0] for m in _drain(broker, "ttlq_long")] == [b"kept"]


def test_priority_after_restart(broker):
    c = broker.connect()
    c.channel().queue_declare("prio", durable=True, arguments={"x-max-priority": 10})
    c.close()
    c = broker.connect()
    ch = c.channel()
    ch.confirm_delivery()
    for p in (1, 5, 9, 3):
        ch.basic_publish("", "prio", b"p%d" % p, pika.BasicProperties(delivery_mode=2, priority=p))
    c.close()
    broker.restart(hard=True)
    assert [m[0] for m in _drain(broker, "prio")] == [b"p9", b"p5", b"p3", b"p1"]


def test_dead_lettering_after_restart(broker):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("src", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq", "x-message-ttl": 1500})
    c.close()
    _publish(broker, "src", [b"dead1", b"dead2"])
    broker.restart()
    deadline = time.monotonic() + 10
    while _count(broker, "dlq") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # dead-lettered copies are persistent and survive another (hard) restart
    broker.restart(hard=True)
    got = _drain(broker, "dlq")
    assert [m[0] for m in got] == [b"dead1", b"dead2"]
    assert got[0][2].headers["x-death"][0]["reason"] == "expired"
    assert _count(broker, "src") == 0


def test_max_length_after_restart(broker):
    c = broker.connect()
    c.channel().queue_declare("ml", durable=True, arguments={"x-max-length": 3})
    c.close()
    _publish(broker, "ml", [b"%d" % i for i in range(5)])
    broker.restart(hard=True)
    assert _count(broker, "ml") == 3
    _publish(broker, "ml", [b"5"])
    broker.restart()
    assert [m[0] for m in _drain(broker, "ml")] == [b"3", b"4", b"5"]


# ------------------------------------------------------------------ damaged journals
def _journal_only(broker):
    if broker.store != "journal":
        pytest.skip("journal-specific")


def _segments(broker):
    from broker.persistence import journal_format as jf
    jdir = broker.data_dir / "journal"
    return jdir, [jdir / jf.seg_name(s) for s in jf.list_segments(str(jdir))]


def _data_end_and_records(path):
    from broker.persistence import journal_format as jf
    data = path.read_bytes()
    recs = []
    res = jf.scan(data, str(path), records=recs)
    return res.end, recs


def test_torn_tail_is_truncated_and_broker_starts(broker):
    _journal_only(broker)
    c = broker.connect()
    c.channel().queue_declare("torn", durable=True)
    c.close()
    _publish(broker, "torn", [b"m%d" % i for i in range(10)])
    broker.kill()  # no checkpoint at shutdown: the records are after the last checkpoint
    _jdir, segs = _segments(broker)
    end, recs = _data_end_and_records(segs[-1])
    os.truncate(segs[-1], end - 7)  # the last record is now a partial write
    broker.start()
    # the listener opens before recovery: a connection waits for it, so drain first and
    # read the log after (checked at once, a slow recovery had logged nothing yet)
    got = [m[0] for m in _drain(broker, "torn")]
    assert "truncated a torn record" in broker.log()
    assert "7" in broker.log() or "bytes" in broker.log()
    assert got == [b"m%d" % i for i in range(9)]
    # and it keeps working afterwards
    _publish(broker, "torn", [b"after"])
    broker.restart(hard=True)
    assert [m[0] for m in _drain(broker, "torn")] == [b"after"]


def test_corrupt_record_refuses_start_and_repair_salvages(broker):
    _journal_only(broker)
    c = broker.connect()
    c.channel().queue_declare("corrupt", durable=True)
    c.close()
    _publish(broker, "corrupt", [b"m%d" % i for i in range(10)])
    broker.kill()
    from broker.persistence import journal_format as jf
    _jdir, segs = _segments(broker)
    end, recs = _data_end_and_records(segs[-1])
    enq = [(off, t) for off, t, _p in recs if t == jf.T_ENQ]
    bad_off = enq[4][0]
    with open(segs[-1], "r+b") as f:
        f.seek(bad_off + jf.HDR_SIZE + 3)
        b = f.read(1)
        f.seek(bad_off + jf.HDR_SIZE + 3)
        f.write(bytes((b[0] ^ 0xFF,)))
    code, err = broker.start_expect_failure()
    assert code != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert str(segs[-1]) in lines[0] and f"offset {bad_off}" in lines[0], lines[0]
    # inspect reports the problem; repair salvages every readable record
    ins = subprocess.run([sys.executable, "-m", "broker", "inspect", "--data-dir",
                          str(broker.data_dir)], cwd=str(REPO_ROOT), capture_output=True, text=True)
    assert "CORRUPT" in ins.stdout or "offset" in ins.stdout
    rep = subprocess.run([sys.executable, "-m", "broker", "repair", "--data-dir",
                          str(broker.data_dir)], cwd=str(REPO_ROOT), capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "dropped" in rep.stdout
    broker.start()
    got = [m[0] for m in _drain(broker, "corrupt")]
    assert got == [b"m%d" % i for i in range(10) if i != 4]


def test_inspect_lists_live_messages(broker):
    _journal_only(broker)
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare("insp", durable=True)
    c.close()
    _publish(broker, "insp", [b"x"] * 7)
    broker.stop()
    out = subprocess.run([sys.executable, "-m", "broker", "inspect", "--data-dir",
                          str(broker.data_dir)], cwd=str(REPO_ROOT), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "queue 'insp': 7" in out.stdout
    assert "00000001.log" in out.stdout
    broker.start()


def test_async_flush_policy_survives_clean_restart(tmp_path, store_url):
    b = BrokerProc(tmp_path / "data", store_url, extra=["--flush", "async"])
    b.start()
    try:
        c = b.connect()
        c.channel().queue_declare("aq", durable=True)
        c.close()
        _publish(b, "aq", [b"a%d" % i for i in range(100)])
        time.sleep(0.5)  # beyond the async fsync interval
        b.restart(hard=True)
        assert _count(b, "aq") == 100
    finally:
        b.stop()


def test_gc_and_compaction_of_old_segments(tmp_path):
    """Small segments: acked segments are deleted, a long-lived message is moved forward."""
    b = BrokerProc(tmp_path / "data", "journal", extra=(
        "--journal-segment-size", str(64 * 1024), "--journal-checkpoint-bytes", str(128 * 1024)))
    b.start()
    try:
        c = b.connect()
        ch = c.channel()
        ch.queue_declare("keep", durable=True)
        ch.queue_declare("churn", durable=True)
        c.close()
        _publish(b, "keep", [b"keeper"])
        body = b"y" * 200
        for _round in range(6):
            _publish(b, "churn", [body] * 300)
            assert len(_drain(b, "churn")) == 300
        time.sleep(0.5)
        from broker.persistence import journal_format as jf
        segs = jf.list_segments(str(b.data_dir / "journal"))
        assert 1 not in segs, f"segment 1 should have been compacted away: {segs}"
        assert len(segs) < 8, segs
        assert "compaction moved" in b.log()
        b.restart(hard=True)
        assert [m[0] for m in _drain(b, "keep")] == [b"keeper"]
        assert _count(b, "churn") == 0
    finally:
        b.stop()


def test_enospc_never_confirms(tmp_path):
    """A full disk (tmpfs): the publish in flight is not confirmed (541), confirmed data survive."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    b = BrokerProc(mnt / "data", "journal")
    try:
        b.start()
        c = b.connect()
        ch = c.channel()
        ch.queue_declare("big", durable=True)
        ch.confirm_delivery()
        body = b"x" * (10 << 20)
        for _ in range(3):
            ch.basic_publish("", "big", body, PERSISTENT)
        st = os.statvfs(mnt)
        junk = mnt / "junk"
        fd = os.open(junk, os.O_CREAT | os.O_RDWR)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - (4 << 20))
        os.close(fd)
        with pytest.raises(pika.exceptions.AMQPError) as ei:
            ch.basic_publish("", "big", body, PERSISTENT)  # needs a new segment: ENOSPC
        assert "541" in repr(ei.value) or "INTERNAL_ERROR" in repr(ei.value) \
            or isinstance(ei.value, pika.exceptions.AMQPConnectionError)
        # the disk alarm (under 50 MiB free) may block the publisher before a write fails
        log = b.log().lower()
        assert "no space left" in log or "resource alarm set: disk" in log
        os.unlink(junk)
        time.sleep(2.5)
        b.restart(hard=True)
        assert _count(b, "big") >= 3  # the three confirmed ones (the 4th may have been written later)
    finally:
        b.kill()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
