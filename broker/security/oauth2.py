"""OAuth 2 / JWT authentication as RabbitMQ's rabbitmq_auth_backend_oauth2: a JWT access token
given as the password (AMQP PLAIN/AMQPLAIN, MQTT CONNECT, HTTP ``Authorization: Bearer``) is
verified against the configured keys and turned into a ``TokenUser`` whose permissions are
the token's scopes:

- ``<prefix>read:<vhost>/<name>``, ``write:``, ``configure:`` (``*`` wildcards in the vhost
  and name patterns, each matched whole),
- topic access (publishes to, and bindings from, topic exchanges: ``write:`` and ``read:``)
  needs a write/read scope whose vhost and exchange patterns match and, if it has a third
  ``/<routing key>`` part, whose routing-key pattern matches the routing (binding) key; a
  two-part scope allows every key, no matching scope none (``rabbit_oauth2_scope``),
- ``<prefix>tag:<tag>`` (administrator, monitoring, management, policymaker).

``prefix`` is ``<resource_server_id>.`` unless set; scopes come from the ``scope`` claim
(a space-separated string or a list) plus ``extra_scopes_source``. The user name is the first
of ``preferred_username_claims`` present, else ``sub``, else ``client_id``.

Keys: PEM files per ``kid`` (a file that is no PEM is an HS256 secret) and/or a JWKS URL,
fetched with httpx at start and again (at most every ``JWKS_MIN_INTERVAL`` seconds) when a
token names a kid not known yet. Logins are synchronous, so such a token is refused once and
accepted as soon as the refreshed set has its key. ``run`` (a broker background task) does the
fetching and closes connections whose token has expired (320 "credential expired"), unless
``connection.update-secret`` gave them a new token first.

Opaque tokens (``introspection_url``, RFC 7662): ``introspect`` asks the endpoint and caches
the answer until the token's exp; the protocols' edges await it before their sessions decide
the login (``Access.needs_introspection``), which then reads the cache."""
from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import trio

from .model import User

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.security.oauth2")

PERMISSIONS = ("configure", "write", "read")
ASYMMETRIC = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256")
JWKS_MIN_INTERVAL = 1.0  # seconds between two fetches asked for by unknown kids
EXPIRY_CHECK_INTERVAL = 0.5  # seconds between two sweeps for expired tokens
# seconds an introspection request may take in all (httpx's own timeout is per read: an
# endpoint trickling its answer would hold the logins waiting for it for ever)
INTROSPECTION_TIMEOUT = 10.0
INTROSPECTION_MAX_ANSWER = 64 * 1024  # octets of an answer read at most
INTROSPECTIONS_IN_FLIGHT = 32  # requests at once; more logins wait for one to end
# an opaque token longer than this is no token (not asked about): a client's password
# would otherwise travel to the endpoint and sit in the cache whatever its size
OPAQUE_TOKEN_MAX = 4096
INTROSPECTED_MAX = 10_000  # answers kept (the oldest go first beyond that)
# an inactive token's answer is kept this long (a client retrying in a loop costs one
# request per period, not one per attempt); an active one until its exp
INACTIVE_TTL = 5.0
ACTIVE_TTL_WITHOUT_EXP = 60.0  # an active token whose answer has no exp


@dataclass
class OAuth2Config:
    resource_server_id: str
    scope_prefix: str | None = None
    signing_keys: dict[str, str] = field(default_factory=dict)  # kid -> PEM file path
    default_key: str | None = None  # the kid used for tokens without one
    jwks_url: str | None = None
    preferred_username_claims: tuple[str, ...] = ()
    extra_scopes_source: str | None = None
    verify_aud: bool = True
    # RFC 7662: opaque tokens are asked about at this endpoint (basic auth with the client
    # id and secret); None: only JWTs are tokens
    introspection_url: str | None = None
    introspection_client_id: str | None = None
    introspection_client_secret: str | None = None

    @property
    def prefix(self) -> str:
        return self.scope_prefix if self.scope_prefix is not None \
            else self.resource_server_id + "."


@dataclass
class TokenUser(User):
    """A user authenticated by a token: nothing stored, permissions from its scopes."""
    scopes: tuple[tuple[str, re.Pattern, re.Pattern], ...] = ()  # (perm, vhost, name)
    # (perm, vhost, exchange, routing key or None: any)
    topic_scopes: tuple[tuple[str, re.Pattern, re.Pattern, re.Pattern | None], ...] = ()
    expires_at: float | None = None  # the token's exp (epoch seconds)
    authz_cache: dict = field(default_factory=dict)  # vhost -> Authz

    def has_vhost(self, vhost: str) -> bool:
        return any(v.fullmatch(vhost) for _p, v, _n in self.scopes)

    def permission_regex(self, vhost: str, perm: str) -> str:
        """The name patterns granting ``perm`` in ``vhost`` as one anchored regex ("" for
        none: nothing allowed)."""
        names = [n.pattern for p, v, n in self.scopes if p == perm and v.fullmatch(vhost)]
        return "^(?:" + "|".join(names) + ")$" if names else ""

    def topic_scopes_in(self, vhost: str) -> tuple:
        """The (perm, exchange, routing key) patterns of the scopes that match ``vhost``."""
        return tuple((p, x, k) for p, v, x, k in self.topic_scopes if v.fullmatch(vhost))

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and time.time() >= self.expires_at


class TokenError(Exception):
    """Why a token was refused (logged, never told to the client)."""


def wildcard(pattern: str) -> re.Pattern:
    """RabbitMQ's scope pattern: ``*`` is any run of characters, the rest is literal."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def looks_like_jwt(secret: str) -> bool:
    parts = secret.split(".")
    return len(parts) == 3 and all(parts[:2]) and len(secret) > 20


class OAuth2:
    def __init__(self, config: OAuth2Config):
        self.config = config
        self.keys: dict[str, object] = {}  # kid -> key (PEM text, bytes secret or JWK key)
        self.jwks: dict[str, object] = {}
        self.missing_kid = trio.Event()  # a token named a kid we do not have
        self.jwks_fetched = 0  # successful fetches (tests wait on it)
        for kid, path in config.signing_keys.items():
            self.keys[kid] = Path(path).read_bytes()
        #: the token's digest (``_digest``) -> (its user, or None: inactive or refused; valid
        #: until, epoch seconds); a digest, so that an entry's size does not depend on the token
        self.introspected: dict[bytes, tuple[TokenUser | None, float]] = {}
        self._introspecting: dict[bytes, trio.Event] = {}  # requests in flight, by digest
        self._in_flight = trio.CapacityLimiter(INTROSPECTIONS_IN_FLIGHT)
        self.introspections = 0  # requests made (tests count them)

    # ---------------------------------------------------------------- introspection
    def needs_introspection(self, token: str) -> bool:
        """True when ``token`` is an opaque token whose answer is not known (yet or any
        more): the login waits for ``introspect`` before it is decided."""
        if self.config.introspection_url is None or not token \
                or len(token) > OPAQUE_TOKEN_MAX or looks_like_jwt(token):
            return False
        cached = self.introspected.get(_digest(token))
        return cached is None or cached[1] <= time.time()

    def introspected_user(self, token: str) -> tuple[bool, TokenUser | None]:
        """(known, user): the cached answer about an opaque token (user None: inactive)."""
        if self.config.introspection_url is None or len(token) > OPAQUE_TOKEN_MAX \
                or looks_like_jwt(token):
            return False, None
        cached = self.introspected.get(_digest(token))
        if cached is None or cached[1] <= time.time():
            return False, None
        user = cached[0]
        if user is not None and user.expired:
            return True, None
        return True, user

    async def introspect(self, token: str) -> None:
        """Ask the introspection endpoint about ``token`` (once for concurrent logins with the
        same token) and cache the answer: active until its exp, inactive or failed for
        ``INACTIVE_TTL``. Never raises: a failure is an inactive answer, logged."""
        key = _digest(token)
        while (pending := self._introspecting.get(key)) is not None:
            await pending.wait()
            if not self.needs_introspection(token):
                return
            # the login that asked was cancelled (its connection closed) before the answer
        done = self._introspecting[key] = trio.Event()
        try:
            async with self._in_flight:
                with trio.move_on_after(INTROSPECTION_TIMEOUT) as scope:
                    user, until = await self._ask(token)
            if scope.cancelled_caught:
                log.warning("OAuth 2: token introspection at %s failed: no answer within "
                            "%s s", self.config.introspection_url, INTROSPECTION_TIMEOUT)
                user, until = None, time.time() + INACTIVE_TTL
            self._remember(key, user, until)
        finally:
            del self._introspecting[key]
            done.set()

    async def _ask(self, token: str) -> tuple[TokenUser | None, float]:
        import httpx
        config = self.config
        assert config.introspection_url is not None
        now = time.time()
        auth = (httpx.BasicAuth(config.introspection_client_id,
                                config.introspection_client_secret or "")
                if config.introspection_client_id else None)
        self.introspections += 1
        try:
            async with httpx.AsyncClient(timeout=INTROSPECTION_TIMEOUT) as client, \
                    client.stream("POST", config.introspection_url, data={
                        "token": token, "token_type_hint": "access_token"},
                        auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT,
                        headers={"Accept": "application/json"}) as r:
                r.raise_for_status()
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > INTROSPECTION_MAX_ANSWER:
                        raise ValueError(
                            f"the answer is longer than {INTROSPECTION_MAX_ANSWER} octets")
            claims = json.loads(body)
            if not isinstance(claims, dict):
                raise ValueError("the answer is not a JSON object")
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("OAuth 2: token introspection at %s failed: %s",
                        config.introspection_url, exc)
            return None, now + INACTIVE_TTL
        if claims.get("active") is not True:
            log.warning("OAuth 2 login refused: introspection says the token is not active")
            return None, now + INACTIVE_TTL
        exp = claims.get("exp")
        if isinstance(exp, (int, float)) and exp <= now:
            log.warning("OAuth 2 login refused: introspected token expired")
            return None, now + INACTIVE_TTL
        aud = claims.get("aud")
        if config.verify_aud and aud is not None and config.resource_server_id not in (
                aud if isinstance(aud, list) else [aud]):
            log.warning("OAuth 2 login refused: introspected token audience does not "
                        "include '%s'", config.resource_server_id)
            return None, now + INACTIVE_TTL
        try:
            # RFC 7662's user name is "username", after the configured claims
            user = self.user_from_claims(claims, extra_names=("username",))
        except TokenError as exc:
            log.warning("OAuth 2 login refused: introspected token - %s", exc)
            return None, now + INACTIVE_TTL
        until = float(exp) if isinstance(exp, (int, float)) else now + ACTIVE_TTL_WITHOUT_EXP
        return user, until

    def _remember(self, key: bytes, user: TokenUser | None, until: float) -> None:
        cache = self.introspected
        if len(cache) >= INTROSPECTED_MAX:
            now = time.time()
            for key in [k for k, (_u, t) in cache.items() if t <= now]:
                del cache[key]
            while len(cache) >= INTROSPECTED_MAX:
                del cache[next(iter(cache))]
        cache.pop(key, None)
        cache[key] = (user, until)

    # ---------------------------------------------------------------- verification
    def _key(self, kid: str | None):
        kid = kid or self.config.default_key
        if kid is None and len(self.keys) + len(self.jwks) == 1:
            return next(iter({**self.keys, **self.jwks}.values()))
        if kid is None:
            raise TokenError("no kid in the token and no default key")
        key = self.keys.get(kid) or self.jwks.get(kid)
        if key is None:
            if self.config.jwks_url:
                self.missing_kid.set()
            raise TokenError(f"unknown signing key '{kid}'")
        return key

    def decode(self, token: str) -> dict:
        import jwt  # with its cryptography: on use, not at every start (time to listening)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenError(f"not a JWT: {exc}") from None
        key = self._key(header.get("kid"))
        if isinstance(key, bytes) and not key.lstrip().startswith(b"-----BEGIN"):
            algorithms = ["HS256"]  # a file that is no PEM: a shared secret
            key = key.strip()
        else:
            algorithms = list(ASYMMETRIC)
        try:
            return jwt.decode(token, key, algorithms=algorithms,  # type: ignore[arg-type]
                              audience=self.config.resource_server_id
                              if self.config.verify_aud else None,
                              options={"verify_aud": self.config.verify_aud})
        except jwt.ExpiredSignatureError:
            raise TokenError("token expired") from None
        except jwt.InvalidAudienceError:
            raise TokenError("token audience does not include "
                             f"'{self.config.resource_server_id}'") from None
        except jwt.PyJWTError as exc:
            raise TokenError(f"invalid token: {exc}") from None

    def user(self, token: str) -> TokenUser:
        """The user of a valid token, else TokenError."""
        return self.user_from_claims(self.decode(token))

    def user_from_claims(self, claims: dict, extra_names: tuple[str, ...] = ()) -> TokenUser:
        """The user (name, tags, permissions, expiry) a verified token's claims make, or
        TokenError: a JWT's, or an introspection answer's (``extra_names``: its username)."""
        name = None
        for claim in (*self.config.preferred_username_claims, *extra_names, "sub",
                      "client_id"):
            if isinstance(claims.get(claim), str) and claims[claim]:
                name = claims[claim]
                break
        if name is None:
            raise TokenError("no user name claim (sub, client_id) in the token")
        scopes = _scope_list(claims.get("scope"))
        if self.config.extra_scopes_source:
            scopes += _scope_list(claims.get(self.config.extra_scopes_source))
        prefix = self.config.prefix
        tags, perms, topics = [], [], []
        for scope in scopes:
            if not scope.startswith(prefix):
                continue
            kind, sep, rest = scope[len(prefix):].partition(":")
            if not sep:
                continue
            if kind == "tag":
                tags.append(rest)
            elif kind in PERMISSIONS:
                vhost, sep, name_pattern = rest.partition("/")
                if not sep:
                    continue
                name_pattern, sep, key_pattern = name_pattern.partition("/")
                # the default vhost is written %2F in scopes, as RabbitMQ's docs do
                v, n = wildcard(unquote(vhost)), wildcard(unquote(name_pattern))
                perms.append((kind, v, n))
                if kind != "configure":
                    topics.append((kind, v, n, wildcard(unquote(key_pattern)) if sep else None))
        exp = claims.get("exp")
        return TokenUser(name=name, tags=tuple(tags), scopes=tuple(perms),
                         topic_scopes=tuple(topics),
                         expires_at=float(exp) if isinstance(exp, (int, float)) else None)

    def login(self, username: str, token: str, peer_host: str | None) -> TokenUser | None:
        """The token's user, or None with RabbitMQ's log line naming the user."""
        try:
            return self.user(token)
        except TokenError as exc:
            log.warning("OAuth 2 login refused: user '%s' (token sub '%s') - %s (peer %s)",
                        _shown(username), _shown(_unverified_sub(token)), exc, peer_host)
            return None

    # ---------------------------------------------------------------- background
    async def fetch_jwks(self) -> None:
        import httpx
        import jwt
        assert self.config.jwks_url is not None
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(self.config.jwks_url)
            r.raise_for_status()
            keys = {}
            for jwk in r.json().get("keys", []):
                kid = jwk.get("kid")
                if kid:
                    keys[kid] = jwt.PyJWK.from_json(json.dumps(jwk)).key
        self.jwks = keys
        self.jwks_fetched += 1
        log.info("OAuth 2: %d signing keys from %s", len(keys), self.config.jwks_url)

    async def _keep_jwks(self) -> None:
        while True:
            try:
                await self.fetch_jwks()
            except Exception as exc:
                log.warning("OAuth 2: fetching %s failed: %s", self.config.jwks_url, exc)
            await trio.sleep(JWKS_MIN_INTERVAL)
            await self.missing_kid.wait()
            self.missing_kid = trio.Event()

    async def run(self, broker: Broker) -> None:
        """Fetch the JWKS (again on unknown kids) and close connections whose token expired."""
        from .. import errors
        async with trio.open_nursery() as nursery:
            if self.config.jwks_url:
                nursery.start_soon(self._keep_jwks)
            closed: set = set()  # sessions told already (they leave once their output is out)
            while True:
                await trio.sleep(EXPIRY_CHECK_INTERVAL)
                closed &= set(map(id, broker.sessions))
                for session in list(broker.sessions):
                    user = session.user
                    if isinstance(user, TokenUser) and user.expired and id(session) not in closed:
                        closed.add(id(session))
                        log.warning("closing connection of user '%s': credential expired",
                                    user.name)
                        session.force_close(errors.connection_forced("credential expired"))


def _unverified_sub(token: str) -> str:
    """The sub a refused token claims (for the log only: it may be forged)."""
    import jwt
    try:
        sub = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.PyJWTError:
        return ""
    return sub if isinstance(sub, str) else ""


def _scope_list(value) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _shown(name: str) -> str:
    from .login import shown
    return shown(name)
