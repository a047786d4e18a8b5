"""How a login is decided: passwords (with loopback-only users), SCRAM's stored keys, OAuth 2
tokens as passwords, EXTERNAL (a client certificate's name), SASL PLAIN / AMQPLAIN responses;
the refusal texts, log lines and per-protocol attempt counters. ``Logins`` is a part of
``AccessControl``. Does not hold users or permissions (access) nor decide what a user may do
once in (authz, limits)."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import struct

from ..amqp.fields import FieldError, decode_table
from .model import User
from .oauth2 import OAuth2, looks_like_jwt
from .passwords import SHA256, hash_password, scram_tuple, verify_password

log = logging.getLogger("broker.access")

_DUMMY_HASH = hash_password("", SHA256)
# what an unknown user's made-up SCRAM credentials derive from (per process)
_SCRAM_SECRET = os.urandom(32)


def login_refused(mechanism: str) -> str:
    """RabbitMQ's explanation of every failed login (it never says why)."""
    return (f"Login was refused using authentication mechanism {mechanism}. "
            f"For details see the broker logfile.")


def _log_refused(mechanism: str, username: str, why: str, peer_host: str | None) -> None:
    """RabbitMQ's log line of a refused AMQP login, which the client is never told."""
    detail = "can only connect via localhost" if why == LOOPBACK_ONLY else f"- {why}"
    log.warning("%s login refused: user '%s' %s (peer %s)", mechanism, shown(username), detail,
                peer_host)


# why check_login refused (what RabbitMQ's log lines say after the user name)
INVALID_CREDENTIALS = "invalid credentials"
LOOPBACK_ONLY = "loopback only"


def shown(name: str) -> str:
    """A client-chosen name as log lines show it: control characters escaped (a name cannot
    forge a line of its own) and at most 128 characters."""
    out = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in name[:128])
    return out + "..." if len(name) > 128 else out


def is_loopback(host: str | None) -> bool:
    if host is None:
        return True  # a non-IP transport (unix socket, in-process) is local
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def parse_credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(username, password) from a PLAIN or AMQPLAIN response, None if malformed."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            table, _ = decode_table(struct.pack(">I", len(response)) + response, 0)
        except (FieldError, IndexError, struct.error):
            return None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            return None
        return _as_str(login), _as_str(password)
    return None


def _as_str(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Logins:
    """The login half of ``AccessControl`` (which sets these attributes)."""

    users: dict[str, User]
    loopback_users: set[str]
    oauth2: OAuth2 | None
    auth_attempts: dict[str, list[int]]

    def count_attempt(self, protocol: str | None, ok: bool) -> None:
        if protocol is None:
            return
        c = self.auth_attempts.setdefault(protocol, [0, 0, 0])
        c[0] += 1
        c[1 if ok else 2] += 1

    def authenticate(self, username: str, password: str, peer_host: str | None = None,
                     protocol: str | None = None) -> User | None:
        """The user if ``password`` is theirs and they may log in from ``peer_host``
        (loopback users only from loopback); None otherwise, in about the same time
        whether the user exists or not. The caller delays its refusal by
        ``failure_delay`` seconds (without blocking anybody else)."""
        user, why = self.check_login(username, password, peer_host, protocol)
        if why == LOOPBACK_ONLY:
            log.warning("user '%s' can only connect via localhost (peer %s)", shown(username),
                        peer_host)
        return user

    def check_login(self, username: str, password: str, peer_host: str | None = None,
                    protocol: str | None = None) -> tuple[User | None, str]:
        user, why = self._check_login(username, password, peer_host)
        self.count_attempt(protocol, user is not None)
        return user, why

    def _check_login(self, username: str, password: str,
                     peer_host: str | None = None) -> tuple[User | None, str]:
        """``authenticate`` without logging: (user, "") or (None, ``INVALID_CREDENTIALS``
        for an unknown user or a wrong password, ``LOOPBACK_ONLY``), for callers that log
        the refusal in their protocol's words. With OAuth 2 configured, a password that is
        a JWT is verified as a token first (any user name; the token's claims name the user),
        then as an internal user's password, as RabbitMQ's backend chain (oauth2, internal)."""
        if self.oauth2 is not None and looks_like_jwt(password):
            token_user = self.oauth2.login(username, password, peer_host)
            if token_user is not None:
                return token_user, ""
        if self.oauth2 is not None:
            _known, token_user = self.oauth2.introspected_user(password)
            if token_user is not None:
                return token_user, ""
        user = self.users.get(username)
        if user is None:
            verify_password(password, _DUMMY_HASH, SHA256)
            return None, INVALID_CREDENTIALS
        if not verify_password(password, user.password_hash, user.hashing_algorithm):
            return None, INVALID_CREDENTIALS
        if user.name in self.loopback_users and not is_loopback(peer_host):
            return None, LOOPBACK_ONLY
        return user, ""

    def scram_lookup(self, username: str) -> tuple[bytes, int, bytes, bytes] | None:
        """A SCRAM server's first step: (salt, iterations, StoredKey, ServerKey) of
        ``username``; None when the user exists without SCRAM credentials (made from a hash).
        An unknown user gets made-up ones, stable per name, that no proof matches, so the
        exchange runs to its end as for a wrong password."""
        user = self.users.get(username)
        if user is None:
            made = hmac.new(_SCRAM_SECRET, username.encode("utf-8", "surrogatepass"),
                            hashlib.sha256).digest()
            return made[:16], 4096, hashlib.sha256(made).digest(), made
        return scram_tuple(user.scram) if user.password_hash else None

    def verified_login(self, username: str, peer_host: str | None,
                       protocol: str | None = None) -> User | None:
        """The user whose password a challenge exchange (SCRAM) has just proven: the
        checks of ``authenticate`` besides the password (loopback-only users)."""
        user = self.users.get(username)
        if user is not None and user.name in self.loopback_users and not is_loopback(peer_host):
            log.warning("user '%s' can only connect via localhost (peer %s)", shown(username),
                        peer_host)
            user = None
        self.count_attempt(protocol, user is not None)
        return user

    def needs_introspection(self, username: str, password: str) -> bool:
        """True when the login with this password waits for ``introspect`` first: OAuth 2
        token introspection is configured, the password is no JWT and not an internal
        user's password, and no answer about it is cached. The protocols' edges ask this
        before they decide a login (their sessions decide synchronously)."""
        oauth2 = self.oauth2
        if oauth2 is None or not oauth2.needs_introspection(password):
            return False
        user = self.users.get(username)
        return user is None or not verify_password(password, user.password_hash,
                                                   user.hashing_algorithm)

    async def introspect(self, password: str) -> None:
        """Ask the introspection endpoint about an opaque token; the next login with it is
        decided from the cached answer."""
        assert self.oauth2 is not None
        await self.oauth2.introspect(password)

    def login(self, mechanism: str, response: bytes, peer_host: str | None,
              peer_cert_user: str | None = None,
              protocol: str = "amqp091") -> tuple[User | None, str]:
        """An AMQP login (connection.start-ok): (user, "") or (None, RabbitMQ's refusal
        text, "" for a malformed response, which RabbitMQ answers by dropping the
        socket). EXTERNAL maps ``peer_cert_user`` (the client certificate's CN) to a user."""
        if mechanism == "EXTERNAL":
            user = self.users.get(peer_cert_user) if peer_cert_user is not None else None
            if user is None or (user.name in self.loopback_users and not is_loopback(peer_host)):
                self.count_attempt(protocol, False)
                why = LOOPBACK_ONLY if user is not None else INVALID_CREDENTIALS
                _log_refused(mechanism, peer_cert_user or "", why, peer_host)
                return None, login_refused(mechanism)
            self.count_attempt(protocol, True)
            return user, ""
        if mechanism not in ("PLAIN", "AMQPLAIN"):
            return None, f"unsupported authentication mechanism '{mechanism}'"
        creds = parse_credentials(mechanism, response)
        if creds is None:
            return None, ""
        user, why = self.check_login(creds[0], creds[1], peer_host, "amqp091")
        if user is None:
            _log_refused(mechanism, creds[0], why, peer_host)
            return None, login_refused(mechanism)
        return user, ""

