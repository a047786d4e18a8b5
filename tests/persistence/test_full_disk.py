"""A REAL full disk under the journal and SQLite stores (a small tmpfs filled with a
ballast file), with a publisher using confirms and a consumer draining at the same time.

The contract (persistence.base.Store, docs/durability.md "Write failures"): nothing
confirmed is lost, nothing nacked is ever delivered (during the failure, after it, or
after a restart), and the connections of consumers stay open while writes fail -- they
keep draining, which is what frees space. Only the publishers waiting for a write in
doubt are closed (541). The figures printed (``-s``) are those of
docs/performance-durability.md.

Needs root (``mount -t tmpfs``); skipped where mounting is not permitted.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest

from .test_sql_store import PY, REPO, _free_port, _reachable

BODY = 16 * 1024
SEGMENT = 1024 * 1024


@contextlib.contextmanager
def tmpfs(path, size_mib: int):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield str(path)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: str, leave: int) -> str:
    """A ballast file leaving about ``leave`` bytes free on ``disk``."""
    path = os.path.join(disk, "ballast")
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if free > leave:
            os.posix_fallocate(fd, 0, free - leave)
    finally:
        os.close(fd)
    return path


class BrokerProc:
    def __init__(self, data_dir: str, store: str, log_path: str):
        self.data_dir = data_dir
        self.store = store
        self.log_path = log_path
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, wait: float = 60.0) -> None:
        self.log = open(self.log_path, "a")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [PY, "-m", "tests.persistence.diskbroker", str(self.port), self.data_dir,
             self.store, str(SEGMENT), str(4 * SEGMENT)],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited: {self.text()}")
            if _reachable("127.0.0.1", self.port):
                return
            time.sleep(0.05)
        raise AssertionError(f"broker did not start: {self.text()}")

    def text(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()


def _connect(port):
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, connection_attempts=5, retry_delay=0.3, heartbeat=0,
        blocked_connection_timeout=None))


def _body(i: int) -> bytes:
    return (b"%d:" % i).ljust(BODY, b".")


def _id(body: bytes) -> int:
    return int(body.split(b":", 1)[0])


class Publisher(threading.Thread):
    """Persistent messages with confirms, one at a time; a connection closed while a
    publish waits makes that id in doubt, and the publisher reconnects."""

    def __init__(self, port, first_id: int = 0):
        super().__init__(daemon=True)
        self.port = port
        self.first_id = first_id
        self.confirmed: dict[int, float] = {}
        self.nacked: dict[int, float] = {}
        self.doubted: dict[int, float] = {}
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def _channel(self):
        import pika
        while not self.stop_event.is_set():
            try:
                conn = _connect(self.port)
                ch = conn.channel()
                ch.confirm_delivery()
                return conn, ch
            except pika.exceptions.AMQPError:
                time.sleep(0.1)
        return None, None

    def run(self):
        import pika
        try:
            conn, ch = self._channel()
            props = pika.BasicProperties(delivery_mode=2)
            i = self.first_id
            while ch is not None and not self.stop_event.is_set():
                try:
                    ch.basic_publish("", "q", _body(i), props)
                    self.confirmed[i] = time.monotonic()
                except pika.exceptions.NackError:
                    self.nacked[i] = time.monotonic()
                    time.sleep(0.01)
                except pika.exceptions.AMQPError:
                    self.doubted[i] = time.monotonic()
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn, ch = self._channel()
                i += 1
            if conn is not None and conn.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):  # a broker shutting down
                    conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self):
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "publisher stuck"
        assert self.error is None, repr(self.error)


class Consumer(threading.Thread):
    """basic.consume with manual acks, ``delay`` seconds per message. Counts the times
    its connection was closed under it (it reconnects, to see what it would have lost)."""

    def __init__(self, port, delay: float):
        super().__init__(daemon=True)
        self.port = port
        self.delay = delay
        self.got: list[int] = []
        self.closed = 0
        self.last = time.monotonic()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        import pika
        try:
            while not self.stop_event.is_set():
                try:
                    conn = _connect(self.port)
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=20)
                    while not self.stop_event.is_set():
                        for method, _props, body in ch.consume("q", inactivity_timeout=0.2):
                            if method is None or self.stop_event.is_set():
                                break
                            self.got.append(_id(body))
                            self.last = time.monotonic()
                            if self.delay:
                                time.sleep(self.delay)
                            ch.basic_ack(method.delivery_tag)
                    ch.cancel()
                    conn.close()
                except pika.exceptions.AMQPError:
                    self.closed += 1
                    time.sleep(0.1)
        except BaseException as exc:
            self.error = exc

    def idle_for(self, seconds: float, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if time.monotonic() - self.last >= seconds:
                return
            time.sleep(0.05)
        raise AssertionError("the consumer never ran dry")

    def finish(self):
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "consumer stuck"
        assert self.error is None, repr(self.error)


def _declare(port):
    conn = _connect(port)
    conn.channel().queue_declare("q", durable=True)
    conn.close()


def _drain(port) -> list[int]:
    conn = _connect(port)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get("q", auto_ack=True)
        if method is None:
            break
        got.append(_id(body))
    conn.close()
    return got


def _wait(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _check(pub: Publisher, delivered: list[int]) -> None:
    got = set(delivered)
    leaked = got & set(pub.nacked)
    assert not leaked, f"{len(leaked)} nacked but delivered: {sorted(leaked)[:10]}"
    lost = set(pub.confirmed) - got
    assert not lost, f"{len(lost)} confirmed but lost: {sorted(lost)[:10]}"
    assert got <= set(pub.confirmed) | set(pub.doubted), "delivered what was never published"
    dups = len(delivered) - len(got)
    assert dups == 0, f"{dups} duplicate deliveries"


def _failing(store: str, pub: Publisher) -> bool:
    """The publisher met the failing store. The journal raises an alarm that blocks it: the
    publisher waiting for a write in doubt is closed (541), its next connection's first
    publish is nacked, then that connection is not read. SQLite nacks each publish."""
    return len(pub.nacked) >= (1 if store == "journal" else 5)


def _assert_not_read_while_blocked(store: str, pub: Publisher) -> None:
    """A blocked publisher is not read: no more nacks while the failure lasts (the slow
    read of a failing store's publishers nacked about ten a second). (pika's blocking
    adapter does not report connection.blocked while it waits for a confirm.)"""
    if store != "journal":
        time.sleep(1.0)
        return
    n = len(pub.nacked)
    time.sleep(1.0)
    assert len(pub.nacked) == n, f"{len(pub.nacked) - n} publishes read while blocked"


def _url(store: str, data_dir: str) -> str:
    return "journal" if store == "journal" else f"sqlite:///{data_dir}/store.db"


@pytest.fixture
def disk(tmp_path):
    with tmpfs(tmp_path / "disk", 16) as path:
        yield path


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_full_disk_confirmed_kept_nacked_never_delivered(tmp_path, disk, store):
    """The disk fills while a publisher (confirms) and a slower consumer run; then space is
    freed. The consumer's connection is never closed, no nacked id is ever delivered,
    every confirmed id is, once; on the journal the publisher is blocked (not read) while
    its writes fail."""
    data = os.path.join(disk, "data")
    b = BrokerProc(data, _url(store, data), str(tmp_path / "broker.log"))
    b.start()
    try:
        _declare(b.port)
        ballast = fill(disk, 4 * SEGMENT)
        cons = Consumer(b.port, delay=0.02)
        cons.start()
        pub = Publisher(b.port)
        pub.start()
        t_full = _wait(lambda: _failing(store, pub), 90, "nacks on the full disk")
        _assert_not_read_while_blocked(store, pub)  # the consumer drains meanwhile
        os.unlink(ballast)
        t_freed = time.monotonic()
        n_conf = len(pub.confirmed)
        _wait(lambda: len(pub.confirmed) > n_conf + 5, 60, "confirms once space is back")
        recover = max(pub.confirmed.values()) - t_freed
        pub.finish()
        cons.idle_for(1.0, 120)
        cons.finish()
        during = list(cons.got)
        b.stop()
        assert "Traceback" not in b.text(), b.text()[-3000:]
        b.start()
        after = _drain(b.port)
    finally:
        b.stop()
    print(f"\n[{store} full disk] nacks after {t_full:.1f} s; {len(pub.confirmed)} confirmed, "
          f"{len(pub.nacked)} nacked, {len(pub.doubted)} in doubt; consumer: {len(during)} "
          f"delivered, connection closed {cons.closed} times; after restart {len(after)}; "
          f"first confirm {recover:.2f} s after space was freed")
    assert pub.nacked or pub.doubted
    assert cons.closed == 0, "the consumer's connection was closed on the write failure"
    _check(pub, during + after)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_full_disk_at_start_consumers_keep_draining(tmp_path, disk, store):
    """A broker restarted on a full disk: the consumers of its backlog are never closed
    (they drain it while new publishes fail), and nothing comes twice."""
    data = os.path.join(disk, "data")
    b = BrokerProc(data, _url(store, data), str(tmp_path / "broker.log"))
    b.start()
    first = Publisher(b.port)
    try:
        _declare(b.port)
        first.start()
        _wait(lambda: len(first.confirmed) >= 200, 120, "the backlog")
        first.finish()
        b.stop()
        # SQLite cannot open its WAL on a disk with no byte free ("disk I/O error", the
        # broker exits at once): it gets a few pages, filled by the first publishes
        fill(disk, 0 if store == "journal" else 256 * 1024)
        b.start()
        cons = Consumer(b.port, delay=0.005)
        cons.start()
        pub = Publisher(b.port, first_id=1_000_000)
        pub.start()
        _wait(lambda: _failing(store, pub), 90, "failing publishes")
        _assert_not_read_while_blocked(store, pub)
        if store != "journal":
            pub.finish()  # SQLite stores a publish now and then: the consumer would never idle
        cons.idle_for(1.0, 120)
        cons.finish()
        # the journal's publisher stays blocked while the disk is full: the broker's
        # shutdown ends its wait
        pub.stop_event.set()
        b.stop()
        pub.finish()
    finally:
        b.stop()
    print(f"\n[{store} full at start] backlog {len(first.confirmed)}: consumer got {len(cons.got)}, "
          f"closed {cons.closed} times; new publishes: {len(pub.confirmed)} confirmed, "
          f"{len(pub.nacked)} nacked, {len(pub.doubted)} in doubt")
    assert cons.closed == 0, "the consumer's connection was closed on the write failure"
    got = set(cons.got)
    assert set(first.confirmed) <= got
    assert not got & set(pub.nacked)
    assert len(cons.got) == len(got), f"{len(cons.got) - len(got)} duplicate deliveries"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", ["journal", "sqlite"])
def test_acks_while_writes_fail_keep_their_effect_after_a_restart(tmp_path, disk, store):
    """A consumer acks a persistent backlog while the store cannot write (a full disk at
    start, a publisher failing meanwhile): its connection stays open, and once space is
    back the acks are stored, so a restart delivers none of the acked messages again (and
    loses no confirmed one)."""
    data = os.path.join(disk, "data")
    b = BrokerProc(data, _url(store, data), str(tmp_path / "broker.log"))
    b.start()
    first = Publisher(b.port)
    try:
        _declare(b.port)
        first.start()
        _wait(lambda: len(first.confirmed) >= 200, 120, "the backlog")
        first.finish()
        b.stop()
        ballast = fill(disk, 0 if store == "journal" else 256 * 1024)
        b.start()
        pub = Publisher(b.port, first_id=1_000_000)
        pub.start()
        _wait(lambda: _failing(store, pub), 90, "failing publishes")
        cons = Consumer(b.port, delay=0.002)  # starts once writes fail: its acks do too
        cons.start()
        # (SQLite stores a publish now and then while nacking most: do not wait for idle)
        _wait(lambda: set(first.confirmed) <= set(cons.got), 120, "the backlog drained")
        cons.finish()
        acked_failing = set(cons.got)
        os.unlink(ballast)
        n = len(pub.confirmed)
        _wait(lambda: len(pub.confirmed) > n + 5, 60, "confirms once space is back")
        pub.finish()
        b.stop()
        assert "Traceback" not in b.text(), b.text()[-3000:]
        b.start()
        after = _drain(b.port)
    finally:
        b.stop()
    print(f"\n[{store} acks on a full disk] backlog {len(first.confirmed)}: acked while failing "
          f"{len(acked_failing)}, consumer closed {cons.closed} times; after restart "
          f"{len(after)} (of them acked before: {len(set(after) & acked_failing)})")
    assert cons.closed == 0, "the consumer's connection was closed on the write failure"
    assert set(first.confirmed) <= acked_failing
    back = set(after) & acked_failing
    assert not back, f"{len(back)} acked messages delivered again after the restart"
    _check(pub, [i for i in cons.got + after if i >= 1_000_000])
