"""Odd names, keys, header tables and bodies through every store backend, end to end.

A real broker (subprocess) on the journal, SQLite, PostgreSQL and MariaDB; pika declares
durable exchanges and queues whose names hold NUL, characters of the SQL store's escape
block (sql_names), accents and emoji up to 255 bytes, binds them with such routing keys,
publishes persistent messages with confirms (headers of every type pika writes, nested,
with NULs and long strings; bodies empty, binary, large); the broker restarts (SIGTERM,
then SIGKILL) and every declare, binding and message must be back, byte for byte.

RabbitMQ (the reference, checked with pika on 3.10) accepts NUL in queue names and
routing keys. Before the fix, PostgreSQL refused the NUL ("PostgreSQL text fields cannot
contain NUL"): the store went down for everyone and the restart lost the declares.
"""
from __future__ import annotations

import datetime
import decimal
import os
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_sql_store import PY, REPO, _free_port, _make_db, _reachable

pika = pytest.importorskip("pika")

BACKENDS = ["journal", "sqlite", "postgresql", "mysql"]


class Proc:
    """``python -m broker run`` on a free port, its output in a file (never a full pipe)."""

    def __init__(self, store: str, data_dir: str, log_path: str):
        self.store, self.data_dir, self.log_path = store, data_dir, log_path
        self.port = _free_port()
        self.http_port = 0  # the management API: off unless a test sets a port
        self.proc: subprocess.Popen | None = None

    def start(self, wait: float = 60.0) -> None:
        args = [PY, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(self.port),
                "--data-dir", self.data_dir, "--http-port", str(self.http_port)]
        if self.store != "journal":
            args += ["--store", self.store]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited: {self.text()[-3000:]}")
            if _reachable("127.0.0.1", self.port) and (
                    not self.http_port or self._recovered()):
                return
            time.sleep(0.05)
        raise AssertionError(f"broker did not start: {self.text()[-3000:]}")

    def _recovered(self) -> bool:
        """The management API answers and says recovery is over: until then it holds other
        requests, and answers 503 to one held 20 s (a slow restart on a loaded machine)."""
        if not _reachable("127.0.0.1", self.http_port):
            return False
        import json
        try:
            status, body = _http(self.http_port, "GET", "/overview")
        except OSError:  # not serving yet
            return False
        return status == 200 and json.loads(body)["recovery"]["ready"]

    def text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    """(store URL or "journal", a factory of broker processes on it)."""
    db = None if request.param == "journal" else _make_db(request.param)
    url = "journal" if db is None else db.url
    procs: list[Proc] = []
    n = [0]

    def make() -> Proc:
        n[0] += 1
        p = Proc(url, str(tmp_path / "data"), str(tmp_path / f"broker{n[0]}.log"))
        procs.append(p)
        return p
    yield request.param, make
    for p in procs:
        p.stop(kill=True)
    if db is not None:
        db.drop()


def _connect(port, vhost="/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, virtual_host=vhost, connection_attempts=5, retry_delay=0.5,
        heartbeat=0, blocked_connection_timeout=60))


def _normal(headers):
    """``headers`` as pika hands them back (its own encoding, decoded)."""
    props = pika.spec.BasicProperties(headers=headers)
    out = pika.spec.BasicProperties()
    out.decode(b"".join(props.encode()))
    return out.headers


# ---------------------------------------------------------------- what is declared
def _fits(s: str) -> bool:
    return 0 < len(s.encode("utf-8")) <= 255 and not s.startswith("amq.")


ODD = [
    "\x00", "nul\x00in the middle", "\x00" * 255, "trailing\x00", "\x00\x01\x02\x1f\x7f",
    "\uf700", "\uf701\uf702\uf780\uf7ff", "\uf700\x00\uf700",       # the SQL escape block
    "é" * 127, "😀" * 63, "a" * 255, "%_\\'\";--", " ", "\t\r\n",
    "Ωmega/ünïcode.\x00#*", "\ufeffbom", "\U0010ffff",
]
ODD_KEYS = ["", "\x00", "k\x00ey", "\uf700\uf7ff", "#.*", "é" * 127, "\x00" * 255]


def _headers(i: int) -> dict:
    """A header table with every field type pika writes (it has no float), NULs, nesting,
    long strings; every AMQP field type is checked byte for byte in test_store_fields.py."""
    return {
        "s": "text\x00with NUL", "\x00key": "nul key", "long": "L" * 70_000,
        "bytes": b"\x00\xff\xfe raw", "int": -(2**31), "big": 2**62, "neg": -(2**62),
        "bool": True, "false": False, "none": None,
        "dec": decimal.Decimal("-12.345"), "ts": datetime.datetime(2026, 11, 27, 21, 0, 0),
        "list": [1, "a\x00", b"\x00", [None, {"deep": [{"deeper": "\uf700"}]}]],
        "table": {"nested": {"more": {"i": i, "s": "\x00" * 300}}},
        "escape-block\uf701": "\uf780",
    }


def _bodies(i: int) -> bytes:
    return [b"", b"\x00", bytes(range(256)) * 4, os.urandom(300_000),
            "ünïcode\x00".encode()][i % 5]


def _cases(names: list[str], keys: list[str]) -> list[tuple[str, str, dict, bytes]]:
    return [(name, keys[i % len(keys)], _headers(i), _bodies(i)) for i, name in enumerate(names)]


def _declare_and_publish(port, cases) -> None:
    conn = _connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for name, key, headers, body in cases:
            ch.exchange_declare(name, "direct", durable=True)
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, name, routing_key=key)
            # confirm_delivery: raises on a nack or a closed channel
            ch.basic_publish(name, key, body, pika.BasicProperties(delivery_mode=2, headers=headers),
                             mandatory=True)
    finally:
        if conn.is_open:
            conn.close()


def _check_after_restart(port, cases) -> None:
    conn = _connect(port)
    try:
        ch = conn.channel()
        for name, key, headers, body in cases:
            ok = ch.queue_declare(name, durable=True, passive=True)
            assert ok.method.message_count == 1, (name, ok.method.message_count)
            ch.exchange_declare(name, "direct", durable=True, passive=True)
            method, props, got = ch.basic_get(name, auto_ack=True)
            assert method is not None, name
            assert (method.exchange, method.routing_key) == (name, key)
            assert got == body
            assert props.delivery_mode == 2
            assert props.headers == _normal(headers), name
        # the bindings are back: a publish through each is routed again
        ch.confirm_delivery()
        for name, key, _headers, _body in cases:
            ch.basic_publish(name, key, b"again", pika.BasicProperties(delivery_mode=2),
                             mandatory=True)
            method, _props, got = ch.basic_get(name, auto_ack=True)
            assert got == b"again", name
    finally:
        if conn.is_open:
            conn.close()


def _lifetimes(make, cases, kill: bool) -> None:
    first = make()
    first.start()
    try:
        _declare_and_publish(first.port, cases)
    except Exception as exc:
        raise AssertionError(f"{exc!r}; broker log:\n{first.text()[-4000:]}") from exc
    first.stop(kill=kill)
    second = make()
    second.start()
    try:
        _check_after_restart(second.port, cases)
    except Exception as exc:
        raise AssertionError(f"{exc!r}; broker log:\n{second.text()[-4000:]}") from exc
    finally:
        second.stop()
    log = first.text() + second.text()
    assert "database lost" not in log and "Traceback" not in log, log[-4000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_odd_names_keys_headers_bodies_survive_a_restart(backend, kill):
    _kind, make = backend
    _lifetimes(make, _cases(ODD, ODD_KEYS), kill)


# names as RabbitMQ takes them: any UTF-8 up to 255 bytes (no lone surrogate: the broker
# refuses a shortstr that is not UTF-8 with 501 on every method but basic.publish)
_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
    ["\x00", "\uf700", "\uf701", "\uf702", "\uf780", "\uf7ff", "é", "😀"])
NAMES = st.text(_ALPHABET, min_size=1, max_size=80).filter(_fits)
KEYS = st.text(_ALPHABET, max_size=80).filter(lambda s: len(s.encode()) <= 255)


@pytest.mark.timeout(600)
def test_fuzzed_names_and_keys_survive_a_restart(backend):
    """Hypothesis draws the names and keys; each example is two broker lifetimes (a crash
    between them), so the examples are few and each declares many names."""
    _kind, make = backend

    @settings(max_examples=3, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(names=st.lists(NAMES, min_size=1, max_size=12, unique=True),
           keys=st.lists(KEYS, min_size=1, max_size=12))
    def run(names, keys):
        _lifetimes(make, _cases(names, keys), kill=True)
    run()


# ---------------------------------------------------------------- the HTTP API
def _http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    import base64
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.timeout(180)
def test_vhost_with_nul_over_http_survives_and_unstorable_declares_are_refused(backend):
    """PUT /api/vhosts/{name} (what ``ctl add_vhost`` calls) with a NUL in the name: created,
    as RabbitMQ keeps any UTF-8 name; its permission, a durable queue in it and a persistent
    message come back after a restart. A durable declare the store cannot hold -- a name
    longer than a shortstr on an SQL store, an argument with a lone surrogate (only JSON
    can say "\\ud800") anywhere -- is answered 400 before anything exists, and the store
    goes on."""
    import json
    kind, make = backend
    vhost = "v\x00h\uf700"
    path = "/vhosts/v%00h%EF%9C%80"
    first = make()
    first.http_port = _free_port()
    first.start()
    try:
        assert _http(first.http_port, "PUT", path, {})[0] == 201
        assert _http(first.http_port, "PUT", "/permissions/v%00h%EF%9C%80/guest",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        # a name AMQP could not say is refused over HTTP as RabbitMQ 3.10 refuses it, on
        # every store (the SQL stores' VARCHAR(255) is never reached)
        status, body = _http(first.http_port, "PUT", "/queues/%2F/" + "a" * 256, {"durable": True})
        assert status == 400 and b"queue should be less than 255 bytes" in body, body
        raw = b'{"durable": true, "arguments": {"x-note": "\\ud800"}}'
        req_status, body = _http_raw(first.http_port, "PUT", "/queues/%2F/surrogate", raw)
        assert req_status == 400 and b"cannot be stored" in body, body
        conn = _connect(first.port, vhost)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("q\x00", durable=True)
        ch.basic_publish("", "q\x00", b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
    except Exception as exc:
        raise AssertionError(f"{exc!r}; broker log:\n{first.text()[-4000:]}") from exc
    first.stop()
    second = make()
    second.http_port = _free_port()
    second.start()
    try:
        status, body = _http(second.http_port, "GET", "/vhosts")
        assert status == 200 and vhost in [v["name"] for v in json.loads(body)]
        status, body = _http(second.http_port, "GET", "/queues")
        names = {(q["vhost"], q["name"]) for q in json.loads(body)}
        assert (vhost, "q\x00") in names and ("/", "surrogate") not in names
        assert ("/", "a" * 256) not in names
        conn = _connect(second.port, vhost)  # the permission is back too
        ch = conn.channel()
        method, _props, got = ch.basic_get("q\x00", auto_ack=True)
        assert got == b"kept"
        conn.close()
    except Exception as exc:
        raise AssertionError(f"{exc!r}; broker log:\n{second.text()[-4000:]}") from exc
    finally:
        second.stop()
    assert "database lost" not in first.text() + second.text()


def _http_raw(port: int, method: str, path: str, data: bytes) -> tuple[int, bytes]:
    import base64
    import urllib.error
    import urllib.request
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}", method=method, data=data,
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
