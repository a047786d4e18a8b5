"""MQTT 5 enhanced authentication (section 4.12): the methods offered, by the name a client
puts in Authentication Method.

A method is sans-IO. ``start`` takes the Authentication Data of a CONNECT (or of an AUTH
0x19 asking to re-authenticate) and a lookup of the user's SCRAM credentials, and answers
with one of: ``Credentials`` (a user name and password the broker then checks, as it does a
CONNECT's User Name and Password: SASL PLAIN, RFC 4616); ``Challenge`` (data for an AUTH
0x18, and the ``step`` that takes the client's next AUTH 0x18: SCRAM-SHA-256); ``Refused``;
``NotOffered`` (the method cannot serve this user: 0x8C Bad authentication method). A step
answers with ``Verified`` (the user proved the password; its data goes back in the CONNACK
or the AUTH 0x00) or ``Refused``.

RabbitMQ's password hashes (one salted SHA-256) cannot give SCRAM's keys, so the broker
keeps SCRAM credentials made whenever a password is set (``security.passwords``); a user
made from a hash has none and is answered ``NotOffered``. ``METHODS`` is the hook: a
method added there is offered."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# user name (without 'vhost:') -> (salt, iterations, StoredKey, ServerKey), or None when the
# user has no SCRAM credentials
Lookup = Callable[[str], "tuple[bytes, int, bytes, bytes] | None"]


@dataclass(frozen=True, slots=True)
class Credentials:
    """What to check against the broker's users (``username`` may carry 'vhost:')."""
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


@dataclass(frozen=True, slots=True)
class NotOffered:
    reason: str


@dataclass(frozen=True, slots=True)
class Verified:
    """The password was proven for ``username`` (may carry 'vhost:'); ``data``: the
    server's last message."""
    username: str
    data: bytes


class Step(Protocol):
    def next(self, data: bytes) -> Verified | Refused: ...


@dataclass(frozen=True, slots=True)
class Challenge:
    data: bytes
    step: Step


class Method(Protocol):
    name: str

    def start(self, data: bytes,
              lookup: Lookup) -> Credentials | Challenge | Refused | NotOffered: ...


class Plain:
    """SASL PLAIN: ``[authzid] NUL authcid NUL passwd``, UTF-8; an authorization identity,
    if given, must be the authentication identity (no acting as another user)."""

    name = "PLAIN"

    def start(self, data: bytes, lookup: Lookup | None = None) -> Credentials | Refused:
        parts = data.split(b"\x00")
        if len(parts) != 3:
            return Refused("PLAIN data is not authzid NUL authcid NUL passwd")
        try:
            authzid, authcid, passwd = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            return Refused("PLAIN data is not UTF-8")
        if not authcid:
            return Refused("PLAIN without a user name")
        if authzid and authzid != authcid:
            return Refused("PLAIN authorization identity differs from the user")
        return Credentials(authcid, passwd)


def _saslname(value: str) -> str | None:
    """RFC 5802's saslname decoded ('=2C' is ',', '=3D' is '='); None if malformed."""
    if "=" not in value:
        return value
    out, i = [], 0
    while i < len(value):
        if value[i] == "=":
            code = value[i + 1:i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                return None
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _printable_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in nonce)


class ScramSha256:
    """SCRAM-SHA-256 (RFC 5802, RFC 7677) over AUTH packets: CONNECT carries the
    client-first-message, AUTH 0x18 the server-first-message, AUTH 0x18 the
    client-final-message, and the CONNACK (or AUTH 0x00 when re-authenticating) the
    server-final-message. No channel binding (gs2 'n' or 'y'; 'p' is refused)."""

    name = "SCRAM-SHA-256"

    def start(self, data: bytes, lookup: Lookup) -> Challenge | Refused | NotOffered:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return Refused("SCRAM client-first-message is not UTF-8")
        parts = text.split(",", 2)
        if len(parts) != 3:
            return Refused("SCRAM client-first-message malformed")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            return Refused("SCRAM channel binding is not supported")
        if cbind not in ("n", "y"):
            return Refused("SCRAM gs2 header malformed")
        attrs = bare.split(",")
        if len(attrs) < 2 or not attrs[0].startswith("n=") or not attrs[1].startswith("r="):
            return Refused("SCRAM client-first-message without n= and r=")
        if any(a.startswith("m=") for a in attrs[2:]):
            return Refused("SCRAM mandatory extension not supported")  # RFC 5802 5.1
        if not all(len(a) > 1 and a[0].isalpha() and a[1] == "=" for a in attrs[2:]):
            return Refused("SCRAM client-first-message malformed")
        username = _saslname(attrs[0][2:])
        if not username:
            return Refused("SCRAM user name malformed")
        if authzid and (not authzid.startswith("a=") or _saslname(authzid[2:]) != username):
            return Refused("SCRAM authorization identity differs from the user")
        client_nonce = attrs[1][2:]
        if not _printable_nonce(client_nonce):
            return Refused("SCRAM nonce malformed")
        creds = lookup(username.split(":", 1)[1] if ":" in username else username)
        if creds is None:
            return NotOffered(f"no SCRAM-SHA-256 credentials for user {username!r} (its "
                              "password was set as a hash)")
        salt, iterations, stored_key, server_key = creds
        nonce = client_nonce + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        step = _ScramStep(username, cbind + "," + authzid + ",", bare, server_first, nonce,
                          stored_key, server_key)
        return Challenge(server_first.encode(), step)


class _ScramStep:
    __slots__ = ("client_first_bare", "gs2_header", "nonce", "server_first", "server_key",
                 "stored_key", "username")

    def __init__(self, username: str, gs2_header: str, client_first_bare: str,
                 server_first: str, nonce: str, stored_key: bytes, server_key: bytes):
        self.username = username
        self.gs2_header = gs2_header
        self.client_first_bare = client_first_bare
        self.server_first = server_first
        self.nonce = nonce
        self.stored_key = stored_key
        self.server_key = server_key

    def next(self, data: bytes) -> Verified | Refused:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return Refused("SCRAM client-final-message is not UTF-8")
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            return Refused("SCRAM client-final-message without a proof")
        attrs = without_proof.split(",")
        if len(attrs) < 2 or not attrs[0].startswith("c=") or not attrs[1].startswith("r="):
            return Refused("SCRAM client-final-message malformed")
        try:
            cbind = base64.b64decode(attrs[0][2:], validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError):
            return Refused("SCRAM client-final-message not base64 where it must be")
        if cbind != self.gs2_header.encode():
            return Refused("SCRAM channel binding data differs from the gs2 header")
        if not hmac.compare_digest(attrs[1][2:].encode(), self.nonce.encode()):
            return Refused("SCRAM nonce differs from the server's")
        if len(proof) != 32:
            return Refused("SCRAM proof of the wrong length")
        auth_message = ",".join((self.client_first_bare, self.server_first,
                                 without_proof)).encode()
        client_signature = hmac.new(self.stored_key, auth_message, hashlib.sha256).digest()
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.stored_key):
            return Refused(f"SCRAM proof wrong for user {self.username!r}")
        server_signature = hmac.new(self.server_key, auth_message, hashlib.sha256).digest()
        return Verified(self.username, b"v=" + base64.b64encode(server_signature))


METHODS: dict[str, Method] = {Plain.name: Plain(), ScramSha256.name: ScramSha256()}
