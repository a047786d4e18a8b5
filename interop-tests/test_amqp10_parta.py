"""AMQP 1.0 beyond links and transfers, with python-qpid-proton's client: SASL EXTERNAL
over TLS (the client certificate's CN is the user), transactions (a coordinator link:
declare, transactional transfers and dispositions, discharge with commit or rollback),
RabbitMQ 4's HTTP-over-AMQP management node on ``/management``, and JMS message groups.

RabbitMQ 3.10's ``rabbitmq_amqp1_0`` plugin takes part where it has the feature
(transactions); it has no management node and no TLS listener here, so those are
TrioMQ's only."""
from __future__ import annotations

import json

import pytest
from brokerproc import BrokerProc, free_port
from proton import Message, SSLDomain
from proton.utils import BlockingConnection
from test_tls import _client_cert, _openssl

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0
RABBIT_PORT = 5672


# ---------------------------------------------------------------- SASL EXTERNAL
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki10")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3", "-subj",
             "/CN=TrioMQ test ca", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "3", "-extfile", "san.cnf",
             cwd=d)
    _client_cert(d, "client", "tls-user", "ca")
    _client_cert(d, "nobody", "no-such-user", "ca")
    return d


def _domain(pki, cert: str | None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    if cert:
        domain.set_credentials(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"), None)
    return domain


def test_sasl_external_maps_the_certificate_cn_to_a_user(pki, tmp_path):
    defs = {"users": [{"name": "tls-user", "password_hash": "", "tags": []}],
            "permissions": [{"user": "tls-user", "vhost": "/", "configure": ".*",
                             "write": ".*", "read": ".*"}]}
    (tmp_path / "defs.json").write_text(json.dumps(defs))
    own, amqps = free_port(), free_port()
    proc = BrokerProc(tmp_path / "data", store="memory", extra=[
        "--amqps10-port", str(own), "--tls-port", str(amqps),
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-ca", str(pki / "ca.pem"), "--load-definitions", str(tmp_path / "defs.json")],
        wait_ports=(own, amqps))
    proc.start()
    try:
        for port in (own, amqps):  # its own port, and sniffed on the 0-9-1 TLS port
            q = f"external-{port}"
            c = BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=WAIT,
                                   ssl_domain=_domain(pki, "client"), allowed_mechs="EXTERNAL")
            try:
                c.create_sender(f"/queue/{q}").send(Message(body="by certificate",
                                                            user_id=b"tls-user"))
                rcv = c.create_receiver(f"/queue/{q}", credit=1)
                m = rcv.receive(timeout=WAIT)
                assert m.body == "by certificate"
                assert m.user_id == b"tls-user"  # the login is the certificate's CN
                rcv.accept()
            finally:
                c.close()
        # a certificate whose CN is no user is refused
        with pytest.raises(Exception, match=r"(?i)auth|sasl|refused"):
            BlockingConnection(f"amqps://127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, "nobody"), allowed_mechs="EXTERNAL")
        # without a certificate EXTERNAL is not offered; PLAIN still works
        with pytest.raises(Exception, match=r"(?i)auth|sasl|mech"):
            BlockingConnection(f"amqps://127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, None), allowed_mechs="EXTERNAL")
        c = BlockingConnection(f"amqps://guest:guest@127.0.0.1:{own}", timeout=WAIT,
                               ssl_domain=_domain(pki, None), allowed_mechs="PLAIN")
        c.close()
    finally:
        proc.stop()
