"""RabbitMQ's password hashes: a hash the machine's RabbitMQ made verifies here, and a hash
made here logs in to that RabbitMQ (temporary users, removed after)."""
from __future__ import annotations

import base64
import hashlib
import secrets

import pytest
from reference import require_rabbitmq_api

from broker.security.passwords import (
    MD5,
    SHA256,
    SHA512,
    check_hash,
    hash_password,
    verify_password,
)

API = "http://127.0.0.1:15672/api"


def _rabbitmq_api():
    require_rabbitmq_api().close()
    import httpx
    return httpx.Client(auth=("guest", "guest"), timeout=10)


def test_format_is_salt_then_digest():
    salt = b"\x01\x02\x03\x04"
    h = hash_password("secret", SHA256, salt)
    raw = base64.b64decode(h)
    assert raw[:4] == salt and raw[4:] == hashlib.sha256(salt + b"secret").digest()
    assert verify_password("secret", h, SHA256)
    assert not verify_password("Secret", h, SHA256)
    assert hash_password("secret") != hash_password("secret")  # fresh salt


@pytest.mark.parametrize("algorithm", [SHA256, SHA512, MD5])
def test_every_algorithm_round_trips(algorithm):
    h = hash_password("pä55", algorithm)
    assert check_hash(h, algorithm) is None
    assert verify_password("pä55", h, algorithm)
    assert not verify_password("pass", h, algorithm)


def test_bad_hashes_never_verify():
    assert not verify_password("", "", SHA256)  # no password: no password login
    assert not verify_password("x", "!!not base64!!", SHA256)
    assert not verify_password("x", hash_password("x"), "rabbit_password_hashing_sha1")
    assert check_hash("AAAA", SHA256) == f"wrong length for {SHA256}"
    assert "unknown hashing algorithm" in check_hash("", "bcrypt")


def test_hash_made_by_rabbitmq_verifies_here_and_ours_logs_in_there():
    api = _rabbitmq_api()
    name = "triomq_test_pw_" + secrets.token_hex(4)
    password = "s3cret-" + secrets.token_hex(4)
    try:
        r = api.put(f"{API}/users/{name}", json={"password": password, "tags": "management"})
        assert r.status_code in (201, 204), r.text
        theirs = api.get(f"{API}/users/{name}").json()
        assert theirs["hashing_algorithm"] == SHA256
        assert verify_password(password, theirs["password_hash"], SHA256)
        assert not verify_password(password + "x", theirs["password_hash"], SHA256)
        # and back: a hash made here is accepted by RabbitMQ
        other = "other-" + secrets.token_hex(4)
        r = api.put(f"{API}/users/{name}", json={"password_hash": hash_password(other),
                                                 "hashing_algorithm": SHA256,
                                                 "tags": "management"})
        assert r.status_code in (201, 204), r.text
        import httpx
        assert httpx.get(f"{API}/whoami", auth=(name, other), timeout=10).status_code == 200
        assert httpx.get(f"{API}/whoami", auth=(name, password), timeout=10).status_code == 401
    finally:
        api.delete(f"{API}/users/{name}")
