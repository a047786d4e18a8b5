"""``python -m broker run --workers N``: N broker processes on this machine that clients see
as one broker (docs/performance.md, "Every core: --workers").

The supervisor (this module, in the process the operator started) starts privately what
the cluster needs, an etcd in ``DATA/etcd`` on a free loopback port, then N ``broker run``
children as cluster nodes ``w1`` .. ``wN``, each with its own data directory ``DATA/wK``.
Every child listens on the same AMQP and management ports with SO_REUSEPORT, so the kernel
spreads new connections over them, and on a private loopback AMQP port of its own that the
other children's node-to-node links reach. A durable queue is owned by one child (the
cluster's placement); a client on another child reaches it through the link forwarding.

Signals: SIGTERM or SIGINT stops every child (brokers first, etcd last). A child that
crashes is started again on the same ports and data (its queues come back from its
journal); one that crashes 5 times in 60 s stops everything with one line. Every child
gets PR_SET_PDEATHSIG: a supervisor killed with -9 takes its children with it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request

from .local import _free_port, _listening

_PR_SET_PDEATHSIG = 1
RESTARTS, RESTART_WINDOW = 5, 60.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def worker_count(text: str) -> int:
    if text == "auto":
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--workers {text}: expected a number >= 1 or auto")
    return int(text)


def _child_argv(argv: list[str]) -> list[str]:
    """The operator's ``run`` arguments without ``--workers``."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--workers":
            skip = True
        elif not item.startswith("--workers="):
            out.append(item)
    return out


_UNSHARED = ("mqtt_port", "mqtts_port", "mqtt_ws_port", "mqtt_wss_port", "stomp_port",
             "stomps_port", "stomp_ws_port", "stomp_wss_port", "stream_tls_port",
             "amqp10_port", "amqps10_port", "hermes_port", "tls_port")


def _problem(args) -> str | None:
    if args.cluster:
        return "--workers runs its own private cluster: not with --cluster"
    given = [name for name in _UNSHARED if vars(args).get(name) is not None]
    if given:
        return (f"--{given[0].replace('_', '-')}: only AMQP and the management API are shared "
                f"by --workers so far; run that listener with --workers 1")
    return None


def _start_etcd(data_dir: str) -> tuple[subprocess.Popen, str]:
    import shutil
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    client, peer = _free_port(), _free_port()
    with open(os.path.join(data_dir, "etcd.log"), "ab") as log:
        proc = subprocess.Popen(
            [etcd, "--name", "workers", "--data-dir", os.path.join(data_dir, "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"workers=http://127.0.0.1:{peer}", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1):
                return proc, f"etcd://127.0.0.1:{client}/workers"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"etcd did not start (see {data_dir}/etcd.log)") from None
            time.sleep(0.1)


class _Stop(Exception):
    pass


def supervise(args, argv: list[str]) -> int:
    try:
        count = worker_count(args.workers)
    except ValueError as exc:
        print(f"triomq: error: {exc}", file=sys.stderr)
        return 2
    problem = _problem(args)
    if problem:
        print(f"triomq: error: {problem}", file=sys.stderr)
        return 2
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    secret = os.path.join(data_dir, "cluster-secret")
    if not os.path.exists(secret):
        with open(secret, "w") as f:
            f.write(os.urandom(24).hex())
        os.chmod(secret, 0o600)
    # one port for all: a port 0 is picked here, not by each child
    port = args.port or _free_port()
    base = [*_child_argv(argv)[1:], "--port", str(port)]  # [0] is "run"
    if args.http_port == 0:
        base += ["--http-port", str(_free_port())]

    def stop(signum, frame):
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    procs: dict[int, subprocess.Popen] = {}
    etcd = None
    try:
        try:
            etcd, url = _start_etcd(data_dir)
        except RuntimeError as exc:
            print(f"triomq: error: {exc}", file=sys.stderr)
            return 1
        private = {i: _free_port() for i in range(1, count + 1)}

        def start(i: int) -> subprocess.Popen:
            cmd = [sys.executable, "-m", "broker", "run", *base,
                   "--data-dir", os.path.join(data_dir, f"w{i}"), "--cluster", url,
                   "--node-name", f"w{i}", "--cluster-secret-file", secret, "--reuse-port",
                   "--private-port", str(private[i]), "--advertise", f"127.0.0.1:{private[i]}"]
            return subprocess.Popen(cmd, preexec_fn=_die_with_parent)

        for i in private:
            procs[i] = start(i)
        crashes: list[float] = []
        ready = False
        while True:
            if not ready and all(_listening(p) for p in private.values()):
                ready = True
                print(f"triomq: {count} workers listening on port {port} "
                      f"(pids {' '.join(str(p.pid) for p in procs.values())})", flush=True)
            for i, proc in list(procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                if not ready:  # never served: a restart would fail the same way
                    print(f"triomq: error: worker w{i} exited with {code} while starting",
                          file=sys.stderr)
                    return 1
                now = time.monotonic()
                crashes = [t for t in crashes if now - t < RESTART_WINDOW] + [now]
                if len(crashes) > RESTARTS:
                    print(f"triomq: error: worker w{i} exited with {code}, "
                          f"{len(crashes)} exits in {RESTART_WINDOW:.0f} s: stopping",
                          file=sys.stderr)
                    return 1
                print(f"triomq: worker w{i} (pid {proc.pid}) exited with {code}; starting "
                      f"it again", file=sys.stderr, flush=True)
                procs[i] = start(i)
            time.sleep(0.2)
    except (_Stop, KeyboardInterrupt):
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*procs.values(), *([etcd] if etcd else [])]:
            if proc is etcd and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
