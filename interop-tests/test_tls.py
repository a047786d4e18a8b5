"""amqps: a TrioMQ with --tls-port, a CA and certificates made here with the openssl CLI;
pika (SSLOptions, PLAIN and EXTERNAL), aio-pika (amqps:// URL) and openssl s_client
connect; TLS 1.1, a client certificate from another CA, an expired one and plain AMQP on
the TLS port each fail alone, while an established TLS connection keeps working; bad TLS
options are one line at start. TrioMQ only (the machine's RabbitMQ has no TLS listener)."""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import time

import pika
import pytest
from brokerproc import BrokerProc, free_port
from pika.credentials import ExternalCredentials

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


@pytest.fixture(scope="module", autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("TrioMQ's own TLS listener (the reference broker has none here)")


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _client_cert(d, name: str, cn: str, ca: str, days: str = "3") -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", days, cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{ca}.key", "-out",
                 f"{ca}.pem", "-days", "3", "-subj", f"/CN=TrioMQ test {ca}", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "3", "-extfile", "san.cnf", cwd=d)
    _client_cert(d, "client", "tls-user", "ca")
    _client_cert(d, "stranger", "tls-user", "other-ca")
    _client_cert(d, "expired", "tls-user", "ca", days="-1")
    return d


def _start(pki, tmp, *extra: str, http: bool = False) -> tuple[BrokerProc, int]:
    defs = {"users": [{"name": "tls-user", "password_hash": "", "tags": []}],
            "permissions": [{"user": "tls-user", "vhost": "/", "configure": ".*",
                             "write": ".*", "read": ".*"}]}
    (tmp / "defs.json").write_text(json.dumps(defs))
    tls_port = free_port()
    bp = BrokerProc(tmp / "data", store="memory", extra=[
        "--tls-port", str(tls_port), "--tls-cert", str(pki / "server.pem"),
        "--tls-key", str(pki / "server.key"), "--tls-ca", str(pki / "ca.pem"),
        "--load-definitions", str(tmp / "defs.json"), *extra], wait_ports=[tls_port],
        http=http)
    bp.start()
    return bp, tls_port


@pytest.fixture(scope="module")
def tls_broker(pki, tmp_path_factory):
    bp, port = _start(pki, tmp_path_factory.mktemp("tls"), http=True)
    yield bp, port
    bp.stop()


def _context(pki, cert: str | None = "client", **kw) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def _pika(pki, port, cert="client", credentials=None, **kw) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(_context(pki, cert, **kw), server_hostname="localhost"),
        connection_attempts=1, socket_timeout=10))


def _roundtrip(conn, queue: str) -> bytes:
    ch = conn.channel()
    ch.queue_declare(queue, auto_delete=True)
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"over tls")
    _m, _p, body = ch.basic_get(queue, auto_ack=True)
    return body


def test_pika_plain_and_external_over_tls(pki, tls_broker):
    _bp, port = tls_broker
    conn = _pika(pki, port)
    assert _roundtrip(conn, "tls-plain") == b"over tls"
    conn.close()
    conn = _pika(pki, port, credentials=ExternalCredentials())  # the certificate's CN
    assert _roundtrip(conn, "tls-external") == b"over tls"
    conn.close()
    conn = _pika(pki, port, cert=None)  # --tls-verify peer without fail-if-no-peer-cert
    assert _roundtrip(conn, "tls-nocert") == b"over tls"
    conn.close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _pika(pki, port, cert=None, credentials=ExternalCredentials())  # no certificate: no user


def test_amqps_connection_shows_ssl_in_management_api(pki, tls_broker):
    """As RabbitMQ's: an amqps connection's object in GET /api/connections has ssl true."""
    import httpx
    bp, port = tls_broker
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, client_properties={"connection_name": "tls-listed"},
        ssl_options=pika.SSLOptions(_context(pki), server_hostname="localhost"),
        connection_attempts=1, socket_timeout=10))
    try:
        listed = []
        for _ in range(50):  # the API lists it once the connection is open
            listed = [c for c in httpx.get(bp.http_url + "/api/connections",
                                           auth=("guest", "guest"), timeout=10).json()
                      if c.get("user_provided_name") == "tls-listed"]
            if listed:
                break
            time.sleep(0.05)
        assert [(c["protocol"], c["ssl"]) for c in listed] == [("AMQP 0-9-1", True)]
    finally:
        conn.close()


def test_aio_pika_amqps_url(pki, tls_broker):
    import aio_pika
    _bp, port = tls_broker

    async def main():
        url = (f"amqps://guest:guest@localhost:{port}/?cafile={pki / 'ca.pem'}"
               f"&certfile={pki / 'client.pem'}&keyfile={pki / 'client.key'}")
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("tls-aio", auto_delete=True)
            await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), "tls-aio")
            msg = await q.get(timeout=5)
            await msg.ack()
            return msg.body
    assert asyncio.run(main()) == b"aio over tls"


def _s_client(pki, port, *args: str) -> bytes:
    """openssl s_client's output after sending the AMQP header, read until the broker's
    connection.start (its mechanisms) arrives or the client exits."""
    import select
    p = subprocess.Popen(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(pki / "ca.pem"),
         "-cert", str(pki / "client.pem"), "-key", str(pki / "client.key"), "-ign_eof", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = b""
    try:
        p.stdin.write(AMQP_HEADER)
        p.stdin.flush()
        deadline = time.monotonic() + 15
        while b"EXTERNAL" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 0.5)
            if ready:
                chunk = p.stdout.read1(65536)
                if not chunk:
                    break
                out += chunk
    finally:
        p.kill()
        p.wait()
        out += p.stdout.read()
    return out


def test_openssl_s_client_gets_connection_start(pki, tls_broker):
    _bp, port = tls_broker
    for version in ("-tls1_3", "-tls1_2"):
        out = _s_client(pki, port, version)
        assert b"Verify return code: 0 (ok)" in out, out[-2000:]
        assert (b"TLSv1.3" if version == "-tls1_3" else b"TLSv1.2") in out
        assert b"PLAIN" in out and b"EXTERNAL" in out  # connection.start's mechanisms
    old = _s_client(pki, port, "-tls1_1")
    assert b"EXTERNAL" not in old and (b"Cipher is (NONE)" in old or b"alert" in old), old[-2000:]


def test_bad_clients_fail_alone(pki, tls_broker):
    bp, port = tls_broker
    conn = _pika(pki, port)
    ch = conn.channel()
    ch.queue_declare("tls-survivor", auto_delete=True)
    for cert in ("stranger", "expired"):
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)):
            _pika(pki, port, cert=cert)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(AMQP_HEADER)  # plain AMQP on the TLS port: closed, no AMQP answer
        s.settimeout(10)
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
        assert b"AMQP" not in got and not got.startswith(b"\x01\x00\x00")
    ch.confirm_delivery()
    ch.basic_publish("", "tls-survivor", b"still here")
    assert ch.basic_get("tls-survivor", auto_ack=True)[2] == b"still here"
    conn.close()
    log = bp.log()
    assert "TLS handshake failed" in log and "Traceback" not in log


def test_fail_if_no_peer_cert(pki, tmp_path):
    bp, port = _start(pki, tmp_path, "--tls-verify", "peer", "--tls-fail-if-no-peer-cert")
    try:
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)):
            _pika(pki, port, cert=None)
        conn = _pika(pki, port)
        assert _roundtrip(conn, "tls-required") == b"over tls"
        conn.close()
    finally:
        bp.stop()


@pytest.mark.parametrize("args,message", [
    (["--tls-port", "5671"], "--tls-port: TLS needs --tls-cert and --tls-key"),
    (["--tls-port", "5671", "--tls-cert", "{pki}/server.pem", "--tls-key", "{pki}/server.key",
      "--tls-verify", "peer"], "--tls-verify peer needs --tls-ca"),
    (["--tls-port", "5671", "--tls-cert", "{pki}/ca.pem", "--tls-key", "{pki}/server.key"],
     "cannot load --tls-cert"),
    (["--tls-port", "5671", "--tls-cert", "{pki}/nope.pem", "--tls-key", "{pki}/server.key"],
     "no such file"),
])
def test_bad_tls_options_are_one_line(pki, tmp_path, args, message, capsys):
    from broker.cli import main
    code = main(["run", "--port", "0", "--data-dir", str(tmp_path / "d"), "--store", "memory",
                 *[a.replace("{pki}", str(pki)) for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
