"""Shared fixtures for the TrioMQ interop suite.

Run against the broker in this repo (started as a subprocess):
    pytest interop-tests
Run against another broker (e.g. the reference RabbitMQ):
    pytest interop-tests --broker-url amqp://guest:guest@127.0.0.1:5672/
    BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ pytest interop-tests

Every test in this directory gets a 60 s pytest-timeout (added as a marker in
pytest_collection_modifyitems, so it beats the ini ``timeout``) unless it carries
its own ``@pytest.mark.timeout`` or ``--timeout`` is given on the command line.

$TRIOMQ_ARGS adds extra arguments to the broker command line (e.g. "--store memory").

``--broker-url`` is declared in the repository's root conftest.py (shared with ``tests/``, so
``pytest tests interop-tests`` is one session); the hypothesis home is set there too.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pika
import pytest

import rawamqp  # the repo's rawamqp/ package (repo root on sys.path via the root conftest.py)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent

DEFAULT_TIMEOUT = 60
STARTUP_TIMEOUT = 20.0


def pytest_collection_modifyitems(config, items):
    if config.getoption("timeout", None) is not None:
        return
    for item in items:
        # only this suite's tests (a repo-wide run keeps the project's own timeout)
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))


# --------------------------------------------------------------------- broker
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def start_triomq(data_dir: Path, extra_args=(), timeout: float = STARTUP_TIMEOUT):
    """Start ``python -m broker run`` from the repo root on a free port; yields the AMQP URL.

    Extra arguments can also come from $TRIOMQ_ARGS (split on whitespace).
    Fails the test with the broker's stderr if it dies or does not listen in time.
    SIGTERM at the end, then SIGKILL after 10 s.
    """
    port = _free_port()
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}-broker-stderr.log"
    out_path = data_dir.parent / f"{data_dir.name}-broker-stdout.log"
    cmd = [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
           "--port", str(port), "--data-dir", str(data_dir),
           # never the default 15672: it is the machine's RabbitMQ's (or, where its plugin is
           # off, a port a reference-broker check would mistake for RabbitMQ's)
           "--http-port", "0",
           *os.environ.get("TRIOMQ_ARGS", "").split(), *extra_args]
    with open(log_path, "wb") as err, open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), stdout=out, stderr=err)

    def logs():
        return (f"command: {' '.join(cmd)}\n--- stderr ({log_path}) ---\n"
                + log_path.read_text(errors="replace")[-5000:]
                + "\n--- stdout ---\n" + out_path.read_text(errors="replace")[-2000:])

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"broker exited with code {proc.returncode} before accepting connections\n"
                            + logs(), pytrace=False)
            if _port_open("127.0.0.1", port):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"broker did not accept connections on port {port} within {timeout}s\n"
                            + logs(), pytrace=False)
            time.sleep(0.1)
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="session")
def external_broker(request) -> bool:
    """True when the suite runs against --broker-url instead of a TrioMQ it started."""
    return bool(request.config.getoption("--broker-url"))


@pytest.fixture(scope="session")
def broker_url(request, tmp_path_factory):
    url = request.config.getoption("--broker-url")
    if url:
        yield url
        return
    with start_triomq(tmp_path_factory.mktemp("triomq") / "data") as url:
        yield url


@dataclass
class AmqpParams:
    host: str
    port: int
    username: str
    password: str
    vhost: str
    url: str

    @property
    def credentials(self):
        return pika.PlainCredentials(self.username, self.password)

    def pika_params(self, **kw) -> pika.ConnectionParameters:
        kw.setdefault("credentials", self.credentials)
        kw.setdefault("virtual_host", self.vhost)
        kw.setdefault("connection_attempts", 1)
        kw.setdefault("socket_timeout", 10)
        kw.setdefault("blocked_connection_timeout", 30)
        return pika.ConnectionParameters(host=self.host, port=self.port, **kw)

    def url_with(self, vhost: str | None = None, password: str | None = None) -> str:
        from urllib.parse import quote
        v = self.vhost if vhost is None else vhost
        p = self.password if password is None else password
        return f"amqp://{self.username}:{quote(p, safe='')}@{self.host}:{self.port}/{quote(v, safe='')}"


@pytest.fixture(scope="session")
def amqp_params(broker_url) -> AmqpParams:
    u = urlparse(broker_url)
    path = u.path[1:] if u.path.startswith("/") else u.path
    vhost = unquote(path) if path else "/"
    return AmqpParams(
        host=u.hostname or "127.0.0.1",
        port=u.port or 5672,
        username=unquote(u.username or "guest"),
        password=unquote(u.password or "guest"),
        vhost=vhost,
        url=broker_url,
    )


# --------------------------------------------------------------------- pika
@pytest.fixture
def connect(amqp_params):
    """Factory: connect(**ConnectionParameters kwargs) -> pika.BlockingConnection.

    All connections are closed at teardown.
    """
    conns = []

    def _connect(**kw):
        c = pika.BlockingConnection(amqp_params.pika_params(**kw))
        conns.append(c)
        return c

    yield _connect
    for c in conns:
        try:
            if c.is_open:
                c.close()
        except Exception:
            pass


@pytest.fixture
def conn(connect):
    return connect()


@pytest.fixture
def ch(conn):
    return conn.channel()


@pytest.fixture
def uid(request):
    """A unique name prefix for the current test."""
    base = request.node.name.replace("[", "-").replace("]", "")[:40]
    return f"itest-{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cleanup(amqp_params):
    """Register names to delete after the test: cleanup.queue(name), cleanup.exchange(name)."""

    class _Cleanup:
        def __init__(self):
            self.queues, self.exchanges = [], []

        def queue(self, name):
            self.queues.append(name)
            return name

        def exchange(self, name):
            self.exchanges.append(name)
            return name

    c = _Cleanup()
    yield c
    if not (c.queues or c.exchanges):
        return
    try:
        bc = pika.BlockingConnection(amqp_params.pika_params())
    except Exception:
        return
    try:
        for kind, names in (("queue", c.queues), ("exchange", c.exchanges)):
            for name in names:
                try:
                    chan = bc.channel()
                    if kind == "queue":
                        chan.queue_delete(name)
                    else:
                        chan.exchange_delete(name)
                    chan.close()
                except Exception:
                    if not bc.is_open:
                        bc = pika.BlockingConnection(amqp_params.pika_params())
    finally:
        try:
            bc.close()
        except Exception:
            pass


@pytest.fixture
def assert_broker_alive(amqp_params):
    """Call to check that a fresh pika connection can still do a round trip."""

    def _check():
        c = pika.BlockingConnection(amqp_params.pika_params())
        try:
            chan = c.channel()
            q = chan.queue_declare("", exclusive=True).method.queue
            chan.basic_publish("", q, b"still-alive")
            deadline = time.monotonic() + 10
            while True:
                m, _, body = chan.basic_get(q, auto_ack=True)
                if m is not None:
                    assert body == b"still-alive"
                    break
                assert time.monotonic() < deadline, "broker did not route a message"
                c.sleep(0.02)
        finally:
            c.close()

    return _check


# --------------------------------------------------------------------- raw
@pytest.fixture
def raw_socket(amqp_params):
    """Factory: raw_socket(timeout=5) -> rawamqp.RawAMQP (not yet handshaken).

    Use ``.handshake()`` for a ready connection.  Closed at teardown.
    """
    socks = []

    def _make(timeout: float = 5.0) -> rawamqp.RawAMQP:
        r = rawamqp.RawAMQP(amqp_params.host, amqp_params.port, timeout=timeout)
        socks.append(r)
        return r

    yield _make
    for r in socks:
        r.close()


@pytest.fixture
def raw_conn(raw_socket, amqp_params):
    """A handshaken raw connection with channel 1 open."""
    r = raw_socket()
    r.handshake(vhost=amqp_params.vhost)
    r.channel_open(1)
    return r
