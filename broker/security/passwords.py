"""RabbitMQ's password hashes: ``base64(salt + H(salt + utf8(password)))`` with a 4-byte
random salt (rabbit_password_hashing_sha256, the default; sha512 and md5 are accepted
from imported definitions), so users exported from RabbitMQ log in here and back."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
ALGORITHMS = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
SALT_SIZE = 4


def hash_password(password: str, algorithm: str = SHA256, salt: bytes | None = None) -> str:
    """The base64 hash of ``password`` as RabbitMQ stores it (a fresh salt unless given).
    Raises ValueError for an unknown algorithm."""
    digest = ALGORITHMS.get(algorithm)
    if digest is None:
        raise ValueError(f"unknown hashing algorithm {algorithm!r}")
    salt = os.urandom(SALT_SIZE) if salt is None else salt
    return base64.b64encode(salt + digest(salt + password.encode("utf-8")).digest()).decode()


def check_hash(password_hash: str, algorithm: str) -> str | None:
    """None if ``password_hash`` is a well-formed hash for ``algorithm`` (or "", no
    password), else what is wrong with it."""
    digest = ALGORITHMS.get(algorithm)
    if digest is None:
        return f"unknown hashing algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})"
    if password_hash == "":
        return None
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return "not valid base64"
    if len(raw) != SALT_SIZE + digest().digest_size:
        return f"wrong length for {algorithm}"
    return None


def verify_password(password: str, password_hash: str, algorithm: str) -> bool:
    """Whether ``password`` matches; False for a user without a password ("") or a
    malformed hash. Constant-time in the digest comparison."""
    digest = ALGORITHMS.get(algorithm)
    if digest is None or not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    salt, expected = raw[:SALT_SIZE], raw[SALT_SIZE:]
    return hmac.compare_digest(digest(salt + password.encode("utf-8")).digest(), expected)


# SCRAM-SHA-256 (RFC 5802/7677) needs the password itself, or what is derived from it with
# PBKDF2: a RabbitMQ hash is a single salted SHA-256, from which no SCRAM key follows. So the
# SCRAM keys are made whenever a password (not a hash) is set, and kept next to the hash.
SCRAM_ITERATIONS = 4096  # RFC 7677's minimum for SCRAM-SHA-256
SCRAM_SALT_SIZE = 16


def scram_keys(salted_password: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of RFC 5802 section 3."""
    client_key = hmac.new(salted_password, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted_password, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def scram_credentials(password: str, salt: bytes | None = None,
                      iterations: int = SCRAM_ITERATIONS) -> dict:
    """The stored form of ``password``'s SCRAM-SHA-256 credentials (base64 fields). The
    password is used as its UTF-8 bytes without SASLprep (the same for any ASCII one)."""
    salt = os.urandom(SCRAM_SALT_SIZE) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    stored_key, server_key = scram_keys(salted)
    b64 = base64.b64encode
    return {"salt": b64(salt).decode(), "iterations": iterations,
            "stored_key": b64(stored_key).decode(), "server_key": b64(server_key).decode()}


def scram_tuple(record: object) -> tuple[bytes, int, bytes, bytes] | None:
    """(salt, iterations, StoredKey, ServerKey) from the stored form; None if it is not
    one (absent, or damaged)."""
    if not isinstance(record, dict):
        return None
    try:
        salt = base64.b64decode(record["salt"], validate=True)
        stored = base64.b64decode(record["stored_key"], validate=True)
        server = base64.b64decode(record["server_key"], validate=True)
        iterations = record["iterations"]
    except (KeyError, TypeError, binascii.Error, ValueError):
        return None
    if not isinstance(iterations, int) or iterations < 1 or len(stored) != 32 \
            or len(server) != 32:
        return None
    return salt, iterations, stored, server
