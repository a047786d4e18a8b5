"""What OAuth 2 logins and Prometheus scrapes cost, in process (no sockets):

- a login: ``access.check_login`` with a password (internal user, SHA-256 hash) against one
  with an RS256 / ES256 / HS256 token (signature, claims, scopes), plus building the token
  user's ``Authz`` for its vhost;
- a scrape: ``/metrics`` (aggregated), ``/metrics/per-object`` and
  ``/metrics/detailed?family=queue_coarse_metrics`` with N queues: the collection (on the
  event loop) and the text formatting (in a worker thread since this change) apart.

    .venv/bin/python -m bench.oauth2_metrics [--queues 10000] [--logins 300]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker.broker import Broker
from broker.config import Config
from broker.management.metrics import BrokerCollector, DetailedCollector, _render
from broker.security.oauth2 import OAuth2, OAuth2Config

SCOPE = "rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*"


def _per_second(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def logins(n: int) -> None:
    broker = Broker(Config())
    access = broker.access
    access.add_user("bench", "bench-password")
    tmp = Path(tempfile.mkdtemp())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    for name, key in (("rsa", rsa_key), ("ec", ec_key)):
        (tmp / f"{name}.pem").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp / "hmac.key").write_bytes(b"a-shared-secret-of-32-bytes-min!")
    access.oauth2 = OAuth2(OAuth2Config("rabbitmq", signing_keys={
        "rsa": str(tmp / "rsa.pem"), "ec": str(tmp / "ec.pem"), "hmac": str(tmp / "hmac.key")}))
    claims = {"sub": "alice", "scope": SCOPE, "aud": "rabbitmq", "exp": int(time.time()) + 3600}
    tokens = {
        "RS256": jwt.encode(claims, rsa_key, "RS256", headers={"kid": "rsa"}),
        "ES256": jwt.encode(claims, ec_key, "ES256", headers={"kid": "ec"}),
        "HS256": jwt.encode(claims, b"a-shared-secret-of-32-bytes-min!", "HS256",
                            headers={"kid": "hmac"}),
    }

    def password() -> None:
        user, _ = access.check_login("bench", "bench-password")
        assert user is not None

    print(f"login, password (SHA-256 hash): {_per_second(password, n):8.0f}/s")
    for alg, token in tokens.items():
        def with_token(token=token) -> None:
            user, _ = access.check_login("x", token)
            assert user is not None
            access.authz(user, "/").check("queue", "q", "read")
        print(f"login, {alg} token + Authz:      {_per_second(with_token, n):8.0f}/s")


def scrapes(queues: int) -> None:
    broker = Broker(Config())
    vhost = broker.vhosts["/"]
    for i in range(queues):
        vhost.declare_queue(f"q{i}", None)
    services = broker.services

    def broker_collector(per_object: bool) -> BrokerCollector:
        return BrokerCollector(services, broker.message_totals, broker.scheduler,
                               lambda: broker.memory_limit, per_object)

    for name, collector in (
            ("/metrics (aggregated)", broker_collector(False)),
            ("/metrics/per-object", broker_collector(True)),
            ("/metrics/detailed queue_coarse",
             DetailedCollector(services, {"queue_coarse_metrics"}, set()))):
        _render(list(collector.collect()))  # warm
        t0 = time.perf_counter()
        families = list(collector.collect())  # on the event loop
        t1 = time.perf_counter()
        body = _render(families)  # in a worker thread
        t2 = time.perf_counter()
        print(f"scrape {name:32s} {queues} queues: collect (event loop) "
              f"{(t1 - t0) * 1000:6.1f} ms, format (thread) {(t2 - t1) * 1000:6.1f} ms, "
              f"{len(body) / 1024:5.0f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=10000)
    parser.add_argument("--logins", type=int, default=300)
    args = parser.parse_args()
    logins(args.logins)
    scrapes(args.queues)


if __name__ == "__main__":
    main()
