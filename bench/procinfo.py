"""Broker process helpers: start TrioMQ, find a broker by listening port, and
read RSS / CPU time from /proc (read-only)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import rawamqp as ra

REPO_ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the broker child (preexec): SIGKILL when the bench that started it dies, however it
    dies (the broker runs in its own session, so a Ctrl-C or a killed bench left it running)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p)
    return seen


def rss_kb(pid: int, field: str = "VmRSS") -> int | None:
    """Sum of `field` (VmRSS or VmHWM) in kB over the process tree."""
    total, found = 0, False
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
                        found = True
                        break
        except OSError:
            pass
    return total if found else None


def cpu_seconds(pid: int) -> float | None:
    total, found = 0.0, False
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
            fields = s[s.rindex(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
            found = True
        except (OSError, ValueError, IndexError):
            pass
    return total if found else None


def pid_listening_on(port: int) -> int | None:
    """PID owning a LISTEN socket on `port` (IPv4/IPv6), via /proc; None if unknown."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            pass
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                try:
                    if os.readlink(f"/proc/{d}/fd/{fd}") in targets:
                        return int(d)
                except OSError:
                    pass
        except OSError:
            pass
    return None


class TrioMQProcess:
    """`python -m broker run` on a free port with a temporary data dir."""

    def __init__(self, python: str | None = None, store: str | None = None,
                 port: int | None = None, data_dir: str | None = None,
                 startup_timeout: float = 30.0, extra_args: list[str] | None = None,
                 quiet: bool = False, module: str = "broker"):
        self.module = module
        self.python = python or sys.executable
        self.port = port or free_port()
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="triomq-bench-")
            data_dir = self._tmp
        self.data_dir = data_dir
        self.cmd = [self.python, "-m", module, "run", "--host", "127.0.0.1",
                    "--port", str(self.port), "--data-dir", data_dir]
        if store:
            self.cmd += ["--store", store]
        self.cmd += extra_args or []
        self.log_path = os.path.join(self._tmp or tempfile.gettempdir(),
                                     f"triomq-bench-broker-{self.port}.log")
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.quiet = quiet

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def log_tail(self, n=30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def start(self):
        if self.module == "broker" and not (REPO_ROOT / "broker" / "__main__.py").exists():
            self.stop()
            raise RuntimeError(f"{REPO_ROOT}/broker/__main__.py does not exist (TrioMQ not available)")
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (the broker's stdout while it runs)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # the death signal follows the starting *thread*: only from the main thread, whose
        # end is the bench's end
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(self.cmd, cwd=str(REPO_ROOT), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True,
                                     preexec_fn=_die_with_parent if main else None)
        deadline = time.monotonic() + self.startup_timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"TrioMQ exited with code {self.proc.returncode} during startup; "
                                   f"log tail:\n{self.log_tail()}")
            try:
                c = ra.Connection(self.url, timeout=2.0)
                c.close(timeout=2.0)
                return self
            except Exception as e:
                last = e
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"TrioMQ did not accept AMQP connections within {self.startup_timeout}s "
                           f"(last error: {last}); log tail:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0):
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
                p.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
