"""Compiled permissions of one user in one vhost (``Authz``), shared by that user's
channels there and kept by ``AccessControl``: regexes are compiled once, allowed names
are cached per permission (the publish path is one set lookup), and the object is
reloaded in place when the user's permissions change, so every channel sees the change
at once. Matching is RabbitMQ's: an unanchored search; the empty regex allows nothing;
the default exchange is matched and reported as ``amq.default``."""
from __future__ import annotations

import re

from .. import errors

DEFAULT_EXCHANGE = "amq.default"
_CACHE_MAX = 4096  # names remembered per permission; a flood of new names just resets it


def compile_permission(regex: str) -> re.Pattern:
    return re.compile(regex if regex else "^$")


def expand_topic(regex: str, username: str, vhost: str) -> re.Pattern:
    """A topic permission with its ``{username}`` / ``{vhost}`` variables filled in (the
    values are matched literally)."""
    regex = regex.replace("{username}", re.escape(username)).replace("{vhost}", re.escape(vhost))
    return compile_permission(regex)


class Authz:
    __slots__ = ("configure", "configure_ok", "impersonator", "read", "read_ok", "scoped",
                 "topics", "username", "vhost", "write", "write_ok")

    def __init__(self, username: str, vhost: str):
        self.username = username
        self.vhost = vhost
        self.impersonator = False
        self.configure: re.Pattern | None = None
        self.write: re.Pattern | None = None
        self.read: re.Pattern | None = None
        self.configure_ok: set = set()
        self.write_ok: set = set()
        self.read_ok: set = set()
        self.topics: dict = {}  # exchange -> (write pattern, read pattern, {(perm, key): ok})
        # an OAuth 2 token's topic scopes ((perm, exchange, routing key or None), ...): when
        # set, topic access needs a matching scope, as rabbit_auth_backend_oauth2
        self.scoped: tuple | None = None

    def reload(self, user, permission, topic_permissions) -> None:
        """Take the user's current permission (None: nothing allowed) and topic
        permissions ({exchange: TopicPermission}); forget every cached result."""
        self.impersonator = bool(user is not None and user.is_impersonator)
        if user is None or permission is None:
            self.configure = self.write = self.read = None
        else:
            self.configure = compile_permission(permission.configure)
            self.write = compile_permission(permission.write)
            self.read = compile_permission(permission.read)
        self.configure_ok = set()
        self.write_ok = set()
        self.read_ok = set()
        self.topics = {}
        if user is not None:
            for tp in (topic_permissions or {}).values():
                self.topics[tp.exchange] = (expand_topic(tp.write, self.username, self.vhost),
                                            expand_topic(tp.read, self.username, self.vhost), {})

    def set_scoped(self, scopes: tuple) -> None:
        """Take an OAuth 2 token's topic scopes. Callers skip ``check_topic`` while
        ``topics`` is empty (the fast path of users without topic permissions), so a marker
        entry (no exchange is named None) keeps it non-empty: a token's topic access is
        always checked."""
        self.scoped = scopes
        self.topics[None] = (None, None, {})

    def _refused(self, kind: str, name: str) -> errors.AMQPError:
        return errors.access_refused("access to %s '%s' in vhost '%s' refused for user '%s'",
                                     kind, name or DEFAULT_EXCHANGE, self.vhost, self.username)

    def check(self, kind: str, name: str, perm: str) -> None:
        """Raise 403 ACCESS_REFUSED unless ``perm`` ("configure" | "write" | "read") on the
        ``kind`` ("exchange" | "queue") ``name`` is allowed."""
        cache = self.write_ok if perm == "write" else self.read_ok if perm == "read" \
            else self.configure_ok
        if name in cache:
            return
        regex = self.write if perm == "write" else self.read if perm == "read" else self.configure
        if regex is None or regex.search(name or DEFAULT_EXCHANGE) is None:
            raise self._refused(kind, name)
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache.add(name)

    def check_topic(self, exchange: str, routing_key: str, perm: str) -> None:
        """Raise 403 unless a topic permission on ``exchange`` (if the user has one) lets
        ``perm`` ("write" | "read") use ``routing_key``."""
        if self.scoped is not None:
            entry = self.topics.setdefault(exchange, (None, None, {}))
        else:
            entry = self.topics.get(exchange)
            if entry is None:
                return
        cache = entry[2]
        key = (perm, routing_key)
        if key in cache:
            return
        if self.scoped is not None:
            allowed = any(p == perm and x.fullmatch(exchange)
                          and (k is None or k.fullmatch(routing_key))
                          for p, x, k in self.scoped)
        else:
            regex = entry[0] if perm == "write" else entry[1]
            allowed = regex.search(routing_key) is not None
        if not allowed:
            raise errors.access_refused(
                "access to topic '%s' in exchange '%s' in vhost '%s' refused for user '%s'",
                routing_key, exchange, self.vhost, self.username)
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = True
