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
