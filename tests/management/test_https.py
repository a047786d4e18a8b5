"""The HTTP listener over TLS (--http-tls with the --tls-* options): httpx with the test's own
CA; plain HTTP on the TLS port fails cleanly and AMQP is not disturbed."""
from __future__ import annotations

import ssl
import subprocess

import httpx
import pytest
import trio

from broker.amqp import spec

from ..support import TrioClient
from .conftest import start_http_broker


def _certs(tmp_path):
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (tmp_path / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


async def test_https(nursery, tmp_path):
    try:
        ca, cert, key = _certs(tmp_path)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("openssl is not available")
    hb = await start_http_broker(nursery, tmp_path, http_tls=True, tls_cert=str(cert),
                                 tls_key=str(key))
    context = ssl.create_default_context(cafile=str(ca))
    async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{hb.http_port}",
                                 auth=("guest", "guest"), verify=context) as api:
        r = await api.get("/api/whoami")
        assert r.status_code == 200 and r.json()["name"] == "guest"
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{hb.http_port}",
                                     auth=("guest", "guest"), timeout=5) as plain:
            await plain.get("/api/whoami")
    with pytest.raises(httpx.HTTPError):  # a client that does not trust the certificate
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{hb.http_port}",
                                     timeout=5) as untrusting:
            await untrusting.get("/api/whoami")
    client = await TrioClient.connect(hb.amqp_port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.aclose()
    with trio.fail_after(5):
        await hb.server.shutdown()
