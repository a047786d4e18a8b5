"""The command line as an operator meets it: start, signals, and clear one-line errors."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path, *extra, port=None):
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(tmp_path / "data"), "--http-port", "0", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


def wait_listening(proc, port, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited early: {proc.stderr.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("broker did not listen")


def test_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, _ = start(tmp_path, "--store", "memory", port=port)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"triomq: error: cannot listen on 127.0.0.1:{port}: address already in use"]


def test_unknown_store_is_one_clear_line(tmp_path):
    proc, _ = start(tmp_path, "--store", "bogus://x")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("triomq: error: unsupported store URL 'bogus://x'")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_closes_connections_with_320_and_exits_0(tmp_path, signum):
    proc, port = start(tmp_path, "--store", "memory")
    try:
        wait_listening(proc, port)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
        proc.send_signal(signum)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.2)
        assert info.value.reply_code == 320
        assert info.value.reply_text == \
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_console_script_and_module_share_the_parser():
    out = subprocess.run([sys.executable, "-m", "broker", "run", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--data-dir", "--store"):
        assert flag in out.stdout
