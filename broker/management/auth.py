"""Basic authentication and RabbitMQ's tag-based authorization for the HTTP API.

Every ``/api`` handler starts with ``require(request, level)``: it authenticates the request's
basic credentials (``broker.access``) and checks the
user's tags. RabbitMQ's levels: ``management`` (own vhosts), ``policymaker`` (+ policies and
parameters of own vhosts), ``monitoring`` (everything, read-only), ``administrator``
(everything). Failures raise ``ApiError`` with RabbitMQ's 401 bodies.
"""
from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio
from starlette.requests import Request

from ..security.login import LOOPBACK_ONLY, shown
from ..security.model import User
from .http import ApiError

if TYPE_CHECKING:
    from ..security import AccessControl

log = logging.getLogger("broker.management")

# Which tags grant each level (RabbitMQ: administrator > monitoring > management,
# administrator > policymaker > management).
LEVELS = {
    "management": {"management", "policymaker", "monitoring", "administrator"},
    "policymaker": {"policymaker", "administrator"},
    "monitoring": {"monitoring", "administrator"},
    "administrator": {"administrator"},
}
KNOWN_TAGS = {"administrator", "monitoring", "policymaker", "management", "impersonator"}
CHALLENGE = {"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'}


@dataclass
class ApiUser:
    """The authenticated caller: its name, tags, and ``broker.access``'s User (if any)."""
    name: str
    tags: frozenset[str] = field(default_factory=frozenset)
    user: User | None = None

    def has(self, level: str) -> bool:
        return bool(self.tags & LEVELS[level])

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.tags

    @property
    def sees_all(self) -> bool:
        """Monitoring and administrator users see every vhost's objects."""
        return self.has("monitoring")


def _tags_of(user: User) -> frozenset[str]:
    tags = user.tags
    if isinstance(tags, str):
        tags = [t for t in tags.replace(",", " ").split() if t]
    return frozenset(tags)


def denied(username: str, why: str, peer_host: str | None) -> None:
    """RabbitMQ's log line of a refused HTTP login (the client only gets "Login failed")."""
    log.warning("HTTP access denied: user '%s' - %s (peer %s)", shown(username), why, peer_host)


def login(access: AccessControl, username: str, password: str,
          peer_host: str | None) -> ApiUser | None:
    """The user for these credentials, or None (wrong password, unknown user, loopback-only
    user from elsewhere), logged as RabbitMQ's management plugin logs it."""
    user, why = access.check_login(username, password, peer_host, "http")
    if user is None:
        denied(username, "User can only log in via localhost" if why == LOOPBACK_ONLY
               else "invalid credentials", peer_host)
        return None
    return ApiUser(user.name, _tags_of(user), user)


def credentials(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    username, sep, password = decoded.partition(":")
    return (username, password) if sep else None


def bearer(request: Request) -> tuple[str, str] | None:
    """``Authorization: Bearer <token>`` as RabbitMQ's OAuth 2 backend takes it (the token
    is the password; its claims name the user)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return "", value.strip()


async def authenticate(request: Request) -> ApiUser:
    """The caller, or ApiError 401 (RabbitMQ's "Login failed" after a short delay)."""
    cached = request.scope.get("triomq.user")
    if cached is not None:
        return cached
    creds = credentials(request)
    if creds is None:
        creds = bearer(request)
    if creds is None:
        raise ApiError(401, "Login failed", "not_authorized", CHALLENGE)
    peer = request.client.host if request.client else None
    broker = request.app.state.broker
    if broker.access.needs_introspection(creds[0], creds[1]):
        await broker.access.introspect(creds[1])  # an opaque OAuth 2 token
    user = login(broker.access, creds[0], creds[1], peer)
    if user is None:
        await trio.sleep(request.app.state.broker.access.failure_delay)
        raise ApiError(401, "Login failed", "not_authorized", CHALLENGE)
    request.scope["triomq.user"] = user
    return user


async def require(request: Request, level: str = "management") -> ApiUser:
    """Authenticate and check ``level``; RabbitMQ answers a missing tag with 401
    ``{"error": "not_authorised", "reason": "Not <level> user"}``."""
    user = await authenticate(request)
    for needed in ("management", level):
        if not user.has(needed):
            name = "monitor" if needed == "monitoring" else needed  # RabbitMQ's wording
            denied(user.name, f"Not {name} user", request.client.host if request.client else None)
            raise ApiError(401, f"Not {name} user", "not_authorised", CHALLENGE)
    return user
