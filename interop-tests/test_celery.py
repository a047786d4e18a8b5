"""Celery end to end: real ``celery worker`` subprocesses (kombu + py-amqp) against the broker.

The tasks live in ``celery_app.py``; every test gets its own queue/exchange names (``uid``),
its own run-record directory and result backend directory, and its own worker processes,
which are always killed (whole process group) at teardown, before the names are deleted.

Result backend: ``file://<tmp dir>`` by default. The ``rpc://`` backend sends results back as
AMQP messages (so it is exercised too, in the plain ``delay()`` test), but it cannot do chords:
celery refuses them (``rpc.py``: "The rpc result backend does not support chords") because the
results go to the caller's private reply queue, where the worker running the chord callback
cannot see them. The filesystem backend is shared by every process on this machine, needs no
extra server, and supports chords through celery's ``chord_unlock`` task (which polls with
countdown=1 retries, i.e. more ETA traffic through the broker). The cache backend would be
per-process, so it is useless here.

Background for ``test_plain_task_not_starved_by_countdown_tasks``: a worker holds ETA/countdown
tasks unacked and raises its prefetch with basic.qos each time it holds one. kombu asks for
``global=true`` on RabbitMQ 3.3 to 3.x (channel-wide limit) and ``global=false`` on any other
server product, i.e. on TrioMQ; a broker that did not apply a later basic.qos(global=false) to
the channel's existing consumer kept the worker at its initial prefetch, so a plain task queued
behind the countdown tasks waited until they were due (14 s instead of well under 1 s).

The workers (not the test process, whose connections sit idle) use a 4 s AMQP heartbeat checked
16 times per interval. Besides exercising heartbeats, that wakes the worker's event loop every
0.25 s: celery only sends the raised basic.qos between two loop iterations, and when the loop
has just drained the socket it sleeps in poll() until its next timer, which with no heartbeat
is the prefork pool's 5 s maintenance timer. That makes the plain task wait 5, 10 or 15 s now
and then on *both* brokers (seen against RabbitMQ 3.10 as well), which says nothing about the
broker; with the 0.25 s tick a correct broker gets it done in well under a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import celery_app
import pytest
from celery import chord, group

HERE = Path(__file__).resolve().parent
WORKER_READY_TIMEOUT = 30.0
# extra settings for the worker processes only (see the module docstring)
WORKER_CONF = {"broker_heartbeat": 4, "broker_heartbeat_checkrate": 16}


class Worker:
    """One ``celery worker`` subprocess in its own session (so killpg reaches its pool)."""

    def __init__(self, cmd, env, log_path: Path, nodename: str):
        self.log_path = log_path
        self.nodename = nodename
        self.cmd = cmd
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=str(HERE), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self) -> str:
        head = f"worker {self.nodename} ({' '.join(self.cmd)})"
        return f"{head}\n--- log {self.log_path} ---\n{self.log()[-6000:]}"

    def wait_ready(self, timeout=WORKER_READY_TIMEOUT):
        deadline = time.monotonic() + timeout
        while f"{self.nodename} ready." not in self.log():
            if self.proc.poll() is not None:
                msg = f"celery worker exited with {self.proc.returncode}"
                pytest.fail(f"{msg}\n{self.describe()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"celery worker not ready within {timeout}s\n" + self.describe(), pytrace=False)
            time.sleep(0.05)

    def received(self, task_id: str) -> bool:
        return f"[{task_id}] received" in self.log()

    def killpg(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self):
        """SIGTERM (warm shutdown) for the group, SIGKILL after 5 s, then SIGKILL any leftover."""
        if self.proc.poll() is None:
            self.killpg(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.killpg(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


class CeleryRun:
    """A client app plus the worker subprocesses of one test."""

    def __init__(self, broker_url: str, queue: str, tmp_path: Path, backend: str):
        self.queue = queue
        self.tmp_path = tmp_path
        self.runs_dir = tmp_path / "runs"
        self.runs_dir.mkdir()
        if backend == "file":
            results = tmp_path / "results"
            results.mkdir()
            result_backend = results.as_uri()  # file:///…
        elif backend == "rpc":
            result_backend = "rpc://"
        else:  # pragma: no cover
            raise ValueError(backend)
        self.config = {"broker_url": broker_url, "queue": queue, "result_backend": result_backend}
        self.app = celery_app.make_app(**self.config)
        self.workers: list[Worker] = []

    # the tasks, as the client sees them
    def task(self, name):
        return self.app.tasks[f"itest.{name}"]

    @property
    def add(self):
        return self.task("add")

    @property
    def tsum(self):
        return self.task("tsum")

    @property
    def record(self):
        return self.task("record")

    @property
    def flaky(self):
        return self.task("flaky")

    def runs(self, pattern="*") -> list[dict]:
        return celery_app.read_runs(self.runs_dir, pattern)

    def start_worker(self, name="w1", concurrency=2, pool="prefork", prefetch_multiplier=1) -> Worker:
        """Start a worker on this run's queue and wait until it consumes."""
        nodename = f"{self.queue}-{name}@itest"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env[celery_app.CONFIG_ENV] = json.dumps({**self.config, **WORKER_CONF})
        cmd = [
            sys.executable, "-m", "celery", "-A", "celery_app", "worker",
            "-Q", self.queue, "-n", nodename, "-P", pool, "-c", str(concurrency),
            "--prefetch-multiplier", str(prefetch_multiplier),
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "-l", "INFO",
        ]  # fmt: skip
        w = Worker(cmd, env, self.tmp_path / f"worker-{name}.log", nodename)
        self.workers.append(w)
        w.wait_ready()
        return w

    def logs(self) -> str:
        return "\n".join(w.describe() for w in self.workers)

    def close(self):
        for w in self.workers:
            w.stop()
        self.app.close()


@pytest.fixture
def celery_run(request, broker_url, uid, tmp_path, cleanup, monkeypatch):
    """A CeleryRun on a unique queue; backend "file" unless parametrized indirectly."""
    for k in [k for k in os.environ if k.startswith("CELERY_")]:
        monkeypatch.delenv(k)  # $CELERY_BROKER_URL etc. would override the app's settings
    backend = getattr(request, "param", "file")
    # deleted after the workers are gone (cleanup is set up first, so torn down last)
    cleanup.queue(uid)
    for ex in (uid, f"{uid}.pidbox", f"reply.{uid}.pidbox", f"{uid}.ev"):
        cleanup.exchange(ex)
    run = CeleryRun(broker_url, uid, tmp_path, backend)
    try:
        yield run
    finally:
        run.close()


def _get(result, run: CeleryRun, timeout=20.0):
    """result.get() that shows the worker logs when it times out."""
    try:
        return result.get(timeout=timeout, interval=0.1)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{run.logs()}") from e


def _wait(pred, run: CeleryRun, what: str, timeout=10.0):
    """Poll pred() until truthy; on timeout fail with the worker logs as they are then."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{run.logs()}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("celery_run", ["rpc", "file"], indirect=True)
def test_delay_and_result(celery_run):
    run = celery_run
    run.start_worker()
    r = run.add.delay(2, 3)
    assert _get(r, run) == 5
    assert r.state == "SUCCESS"
    many = [run.add.delay(i, 100) for i in range(20)]
    assert [_get(x, run) for x in many] == [i + 100 for i in range(20)]


def test_countdown_and_eta_run_at_the_right_time(celery_run):
    run = celery_run
    run.start_worker()
    sent = time.time()
    by_countdown = run.record.apply_async((str(run.runs_dir), "countdown"), countdown=3)
    by_eta = run.record.apply_async((str(run.runs_dir), "eta"), eta=datetime.now(UTC) + timedelta(seconds=3))
    now = run.record.delay(str(run.runs_dir), "now")
    ran_now = _get(now, run)["time"] - sent
    assert ran_now < 2.5, f"plain task took {ran_now:.2f}s\n{run.logs()}"
    # the worker holds both while they are not due, and does not run them early
    assert run.runs("countdown") == [] and run.runs("eta") == []
    for r in (by_countdown, by_eta):
        delay = _get(r, run)["time"] - sent
        assert 2.9 <= delay <= 6.0, f"{r.id} ran {delay:.2f}s after sending (expected ~3s)"
    assert len(run.runs("countdown")) == 1 and len(run.runs("eta")) == 1


def test_plain_task_not_starved_by_countdown_tasks(celery_run):
    """THE REGRESSION: concurrency 2, prefetch multiplier 1 (initial prefetch 2), ten
    countdown=15 tasks in front of a plain task; the plain task must not wait for them."""
    run = celery_run
    w = run.start_worker(concurrency=2, prefetch_multiplier=1)
    d = str(run.runs_dir)
    held = [run.record.apply_async((d, f"held-{i}"), countdown=15) for i in range(10)]
    sent = time.time()
    plain = run.record.delay(d, "plain")
    rec = _get(plain, run, timeout=20)
    latency = rec["time"] - sent
    assert latency < 4.0, (
        f"plain task ran {latency:.1f}s after it was sent, behind 10 countdown tasks: the worker's "
        f"prefetch increases (basic.qos) did not reach its consumer\n{run.logs()}"
    )
    # the worker took every countdown task (prefetch went from 2 to 12) and holds them unacked
    assert all(w.received(r.id) for r in held), run.logs()
    assert run.runs("held-*") == []


def test_retry_then_success(celery_run):
    run = celery_run
    run.start_worker()
    sent = time.time()
    r = run.flaky.delay(str(run.runs_dir), "flaky", 2)
    out = _get(r, run, timeout=20)
    assert out["retries"] == 2
    attempts = run.runs("flaky")
    assert [a["retries"] for a in attempts] == [0, 1, 2]
    assert all(a["task_id"] == r.id for a in attempts)
    # each retry had countdown=1
    assert attempts[1]["time"] - attempts[0]["time"] >= 0.9
    assert attempts[2]["time"] - attempts[1]["time"] >= 0.9
    assert out["time"] - sent < 8
    assert r.state == "SUCCESS"


def test_group_and_chord(celery_run):
    run = celery_run
    run.start_worker()
    g = group(run.add.s(i, i) for i in range(10)).apply_async()
    assert _get(g, run) == [2 * i for i in range(10)]
    c = chord(run.add.s(i, 1) for i in range(8))(run.tsum.s())
    assert _get(c, run, timeout=30) == sum(i + 1 for i in range(8))
    # the callback gets the header results in header order
    c2 = chord([run.add.s([1], [1]), run.add.s([2], [2]), run.add.s([3], [3])])(run.add.s([0]))
    assert _get(c2, run, timeout=30) == [[1, 1], [2, 2], [3, 3], 0]


def test_revoke_countdown_task(celery_run):
    run = celery_run
    w = run.start_worker()
    d = str(run.runs_dir)
    victim = run.record.apply_async((d, "victim"), countdown=3)
    _wait(lambda: w.received(victim.id), run, f"the worker to receive {victim.id}")
    victim.revoke()  # broadcast over the <queue>.pidbox fanout exchange
    control = run.record.apply_async((d, "control"), countdown=3)
    _get(control, run, timeout=20)
    time.sleep(1.0)  # the victim was due before the control task
    assert run.runs("victim") == [], f"revoked task ran\n{run.logs()}"
    assert len(run.runs("control")) == 1
    _wait(lambda: victim.state == "REVOKED", run, f"state REVOKED of {victim.id}", timeout=5)
    assert f"Discarding revoked task: itest.record[{victim.id}]" in w.log(), run.logs()


def test_killed_worker_countdown_tasks_run_on_next_worker(celery_run):
    """SIGKILL a worker that holds countdown tasks (delivered, unacked): the broker requeues
    them and a second worker runs every one of them (at least once, when due)."""
    run = celery_run
    d = str(run.runs_dir)
    first = run.start_worker(name="first")
    sent = time.time()
    countdown = 5
    tasks = [run.record.apply_async((d, f"job-{i}"), countdown=countdown) for i in range(8)]
    ids = {r.id for r in tasks}
    _wait(lambda: all(first.received(i) for i in ids), run, "the first worker to receive them all", 3.5)
    first.killpg(signal.SIGKILL)
    first.proc.wait(5)
    assert run.runs() == [], "a countdown task ran before it was due"
    second = run.start_worker(name="second")
    _wait(lambda: {r["task_id"] for r in run.runs("job-*")} >= ids, run, "every task to run", 20)
    recs = run.runs("job-*")
    assert {r["task_id"] for r in recs} == ids
    for r in recs:
        assert r["hostname"] == second.nodename, r
        assert r["redelivered"] is True, r
        assert r["time"] - sent >= countdown - 0.1, r
    for r in tasks:
        assert _get(r, run)["tag"].startswith("job-")
