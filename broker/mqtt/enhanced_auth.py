"""MQTT 5 enhanced authentication (section 4.12): the methods offered, by the name a client
puts in Authentication Method.

A method is sans-IO: ``start`` takes the Authentication Data of a CONNECT (or of an AUTH
asking to re-authenticate) and answers with the credentials the broker then checks against
its users, as it does a CONNECT's User Name and Password, or with a refusal. A method that
needs more than one round (a challenge) is not supported yet: the interface has no step
for it. The broker's users keep RabbitMQ's salted SHA-256 password hashes, from which no
SCRAM verifier can be derived, so the one method offered is SASL PLAIN (RFC 4616), which
works with them. ``METHODS`` is the hook: a method added there is offered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Credentials:
    """What to check against the broker's users (``username`` may carry 'vhost:')."""
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


class Method(Protocol):
    name: str

    def start(self, data: bytes) -> Credentials | Refused: ...


class Plain:
    """SASL PLAIN: ``[authzid] NUL authcid NUL passwd``, UTF-8; an authorization identity,
    if given, must be the authentication identity (no acting as another user)."""

    name = "PLAIN"

    def start(self, data: bytes) -> Credentials | Refused:
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


METHODS: dict[str, Method] = {Plain.name: Plain()}
