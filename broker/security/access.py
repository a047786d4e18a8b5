"""AccessControl (``broker.access``): users, vhosts, permissions, topic permissions and
limits -- their state, persistence (the store's metadata seam) and the checks. See the
package docstring for the API; ``definitions`` does export/import, ``authz`` the cached
per-(user, vhost) checks, ``login`` how a login is decided, ``limits`` the limit checks."""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from .. import errors
from . import model
from .authz import Authz
from .limits import Limits
from .login import Logins
from .model import NotFound, Permission, TopicPermission, User
from .oauth2 import OAuth2, TokenUser
from .passwords import SHA256, hash_password, scram_credentials

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..services import AccessServices

log = logging.getLogger("broker.access")

# kinds of stored metadata records (Store.save_meta)
KIND_USER = "user"
KIND_VHOST = "vhost"
KIND_PERMISSION = "permission"
KIND_TOPIC = "topic_permission"
KIND_STATE = "access"  # key "initialized": the defaults were created once


def _pkey(*parts: str) -> str:
    return json.dumps(list(parts), ensure_ascii=False)


class AccessControl(Logins, Limits):
    def __init__(self, services: AccessServices, default_user: str = "guest",
                 default_pass: str = "guest",
                 loopback_users: tuple[str, ...] | list[str] = ("guest",),
                 failure_delay: float = 1.0):
        self.services = services
        self.default_user = default_user
        self.default_pass = default_pass
        self.loopback_users = set(loopback_users)
        #: seconds the edge waits before answering a failed login (the caller sleeps)
        self.failure_delay = failure_delay
        self.users: dict[str, User] = {}
        self.vhost_info: dict[str, dict] = {}  # name -> {"description", "tags", "limits", ...}
        self.perms: dict[tuple[str, str], Permission] = {}  # (user, vhost)
        self.topic_perms: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        self._authz: dict[tuple[str, str], Authz] = {}
        #: OAuth 2 tokens as passwords (rabbitmq_auth_backend_oauth2), when configured
        self.oauth2: OAuth2 | None = None
        #: login attempts per protocol: [attempts, succeeded, failed] (Prometheus'
        #: rabbitmq_auth_attempts_*; logins without a protocol, as the cluster link's, are
        #: not counted)
        self.auth_attempts: dict[str, list[int]] = {}
        #: callbacks(vhost name) after a vhost is created / deleted, and callbacks() after
        #: any user or permission change (features caching what the access allows)
        self.on_vhost_added: list = []
        self.on_vhost_deleted: list = []
        self.on_change: list = []
        self._restored = False
        self._defaults()

    def restorers(self) -> dict[str, Callable[[str, dict], None]]:
        """The stored metadata kinds this takes back at recovery, each with its restorer
        (``security.install`` registers them; ``recovered`` runs after them)."""
        return {KIND_USER: self._restore_user, KIND_VHOST: self._restore_vhost,
                KIND_PERMISSION: self._restore_permission, KIND_TOPIC: self._restore_topic,
                KIND_STATE: self._restore_state}

    # ------------------------------------------------------------------ first start
    def _defaults(self) -> None:
        """RabbitMQ's first boot: vhost "/", the default user (administrator) with every
        permission on it. Kept in memory until recovery tells whether the store has state."""
        self.users = {self.default_user: User(self.default_user, hash_password(self.default_pass),
                                              SHA256, ("administrator",))}
        self.vhost_info = {name: {"description": "Default virtual host" if name == "/" else "",
                                  "tags": [], "limits": {}} for name in self.services.vhosts}
        self.perms = {(self.default_user, v): Permission(".*", ".*", ".*") for v in self.vhost_info}
        self.topic_perms = {}

    def recovered(self) -> None:
        """After recovery: the records read back replace the first start's defaults (or
        the defaults are stored, on a store that had none)."""
        store = self.services.store
        if self._restored:
            for name in [n for n in self.services.vhosts if n not in self.vhost_info]:
                if not self.services.vhosts[name].queues:
                    del self.services.vhosts[name]  # deleted before the restart
                else:
                    self.vhost_info[name] = {"description": "", "tags": [], "limits": {}}
                    self._save_vhost(name)
        else:
            for name in self.services.vhosts:
                self.vhost_info.setdefault(name, {"description": "", "tags": [], "limits": {}})
                self._save_vhost(name)
            for user in self.users.values():
                store.save_meta(KIND_USER, user.name, user.stored())
            for (u, v), p in self.perms.items():
                store.save_meta(KIND_PERMISSION, _pkey(u, v), p.record(u, v))
            store.save_meta(KIND_STATE, "initialized", {})
            log.debug("created the default user %r and vhost '/'", self.default_user)
        self._changed()

    # ------------------------------------------------------------------ restore (store)
    def _first_record(self) -> None:
        if not self._restored:
            self._restored = True
            self.users, self.vhost_info, self.perms, self.topic_perms = {}, {}, {}, {}

    def _restore_state(self, key: str, value: dict) -> None:
        self._first_record()

    def _restore_user(self, key: str, value: dict) -> None:
        self._first_record()
        self.users[key] = User(key, value.get("password_hash", ""),
                               value.get("hashing_algorithm", SHA256),
                               tuple(value.get("tags", ())), dict(value.get("limits", {})),
                               value.get("scram_sha256"))

    def _restore_vhost(self, key: str, value: dict) -> None:
        self._first_record()
        self.vhost_info[key] = {"description": value.get("description", ""),
                                "tags": list(value.get("tags", [])),
                                "limits": dict(value.get("limits", {}))}
        if value.get("default_queue_type"):
            self.vhost_info[key]["default_queue_type"] = value["default_queue_type"]
        self.services.create_vhost(key).default_queue_type = value.get("default_queue_type")

    def _restore_permission(self, key: str, value: dict) -> None:
        self._first_record()
        self.perms[(value["user"], value["vhost"])] = Permission(
            value["configure"], value["write"], value["read"])

    def _restore_topic(self, key: str, value: dict) -> None:
        self._first_record()
        self.topic_perms.setdefault((value["user"], value["vhost"]), {})[value["exchange"]] = \
            TopicPermission(value["exchange"], value["write"], value["read"])

    # ------------------------------------------------------------------ persistence helpers
    def _save_vhost(self, name: str) -> None:
        self.services.store.save_meta(KIND_VHOST, name, dict(self.vhost_info[name]))

    def _save_user(self, user: User) -> None:
        self.services.store.save_meta(KIND_USER, user.name, user.stored())

    def _changed(self, username: str | None = None) -> None:
        """Reload the cached checks (of ``username``, or everyone's)."""
        for (u, v), authz in self._authz.items():
            if username is None or u == username:
                authz.reload(self.users.get(u), self.perms.get((u, v)),
                             self.topic_perms.get((u, v)))
        for callback in self.on_change:
            callback()

    # ------------------------------------------------------------------ authentication
    def user(self, name: str) -> User | None:
        return self.users.get(name)

    # ------------------------------------------------------------------ checks
    def authz(self, user: User | str, vhost_name: str) -> Authz:
        """The cached checks of ``user`` in ``vhost_name`` (shared, reloaded in place)."""
        if isinstance(user, TokenUser):  # permissions from the token's scopes
            authz = user.authz_cache.get(vhost_name)
            if authz is None:
                authz = user.authz_cache[vhost_name] = Authz(user.name, vhost_name)
                authz.reload(user, Permission(*(user.permission_regex(vhost_name, p)
                                                for p in ("configure", "write", "read"))), None)
                authz.set_scoped(user.topic_scopes_in(vhost_name))
            return authz
        name = user if isinstance(user, str) else user.name
        key = (name, vhost_name)
        authz = self._authz.get(key)
        if authz is None:
            authz = self._authz[key] = Authz(name, vhost_name)
            authz.reload(self.users.get(name), self.perms.get(key), self.topic_perms.get(key))
        return authz

    def check_vhost(self, user: User | None, vhost_name: str) -> None:
        """530 NOT_ALLOWED unless ``user`` has a permission entry in ``vhost_name``."""
        name = user.name if user is not None else ""
        if isinstance(user, TokenUser):
            if not user.has_vhost(vhost_name):
                raise errors.not_allowed("access to vhost '%s' refused for user '%s'",
                                         vhost_name, name)
            return
        if user is None or (name, vhost_name) not in self.perms:
            raise errors.not_allowed("access to vhost '%s' refused for user '%s'", vhost_name, name)

    def check(self, user: User | str, vhost_name: str, kind: str, name: str, perm: str) -> None:
        """403 ACCESS_REFUSED (RabbitMQ's text) unless ``perm`` ("configure" | "write" |
        "read") on the ``kind`` ("exchange" | "queue") ``name`` is allowed."""
        self.authz(user, vhost_name).check(kind, name, perm)

    def check_topic(self, user: User | str, vhost_name: str, exchange: str, routing_key: str,
                    perm: str) -> None:
        """403 unless the user's topic permission on ``exchange`` (if any) allows ``perm``
        ("write" | "read") for ``routing_key``."""
        self.authz(user, vhost_name).check_topic(exchange, routing_key, perm)
    # ------------------------------------------------------------------ users
    def put_user(self, name: str, password: str | None = None, password_hash: str | None = None,
                 hashing_algorithm: str | None = None, tags=None, limits=None) -> User:
        """Create or update a user (the management API's PUT /api/users/NAME): ``password``
        is hashed (sha256), else ``password_hash`` is taken as is; neither keeps an existing
        user's password (a new one gets none: no password login). Raises DefinitionError.
        A password also gets SCRAM credentials; a hash has none, unless it is the user's
        current one (definitions imported again keep them)."""
        name = model.name("name", name)
        old = self.users.get(name)
        scram = None
        if password is not None:
            if not isinstance(password, str):
                raise model.DefinitionError("password", "must be a string")
            phash, algo = hash_password(password), SHA256
            if password:
                scram = scram_credentials(password)
        elif password_hash is not None:
            phash, algo = model.password_hash("password_hash", password_hash, hashing_algorithm)
            if old is not None and (phash, algo) == (old.password_hash, old.hashing_algorithm):
                scram = old.scram
        elif old is not None:
            phash, algo, scram = old.password_hash, old.hashing_algorithm, old.scram
        else:
            phash, algo = "", SHA256
        user = User(name, phash, algo,
                    model.tags("tags", tags) if tags is not None else (old.tags if old else ()),
                    model.limits("limits", limits, model.USER_LIMITS) if limits is not None
                    else (dict(old.limits) if old else {}), scram)
        self.users[name] = user
        self._save_user(user)
        self._changed(name)
        return user

    def add_user(self, name: str, password: str, tags=None) -> User:
        """rabbitmqctl add_user: refuses an existing user (DefinitionError on "name")."""
        if name in self.users:
            raise model.DefinitionError("name", f"user '{name}' already exists")
        return self.put_user(name, password=password, tags=tags or [])

    def _user(self, name: str) -> User:
        user = self.users.get(name)
        if user is None:
            raise NotFound(f"no such user '{name}'")
        return user

    def delete_user(self, name: str) -> None:
        """Delete a user with their permissions and topic permissions (NotFound if none);
        the user's open connections are closed (320), as RabbitMQ does since 3.7."""
        self._user(name)
        del self.users[name]
        for session in list(self.services.sessions):
            user = session.user
            if user is not None and user.name == name:
                session.force_close(errors.connection_forced("user '%s' is deleted", name))
        store = self.services.store
        store.delete_meta(KIND_USER, name)
        for key in [k for k in self.perms if k[0] == name]:
            del self.perms[key]
            store.delete_meta(KIND_PERMISSION, _pkey(*key))
        for key in [k for k in self.topic_perms if k[0] == name]:
            for exchange in self.topic_perms.pop(key):
                store.delete_meta(KIND_TOPIC, _pkey(*key, exchange))
        self._changed(name)

    def change_password(self, name: str, password: str) -> None:
        self._user(name)
        self.put_user(name, password=password)

    def clear_password(self, name: str) -> None:
        self._user(name)
        self.put_user(name, password_hash="")

    def set_user_tags(self, name: str, tags) -> None:
        self._user(name)
        self.put_user(name, tags=tags)

    def set_user_limits(self, name: str, limits: dict) -> None:
        """Set (merge) user limits: max-connections, max-channels (negative: no limit)."""
        user = self._user(name)
        merged = dict(user.limits)
        merged.update(model.limits("limits", limits, model.USER_LIMITS))
        self.put_user(name, limits=merged)

    def clear_user_limits(self, name: str, limit: str | None = None) -> None:
        """Clear one limit (``limit``) or all of a user's limits."""
        user = self._user(name)
        self.put_user(name, limits={} if limit in (None, "all") else
                      {k: v for k, v in user.limits.items() if k != limit})

    def list_users(self) -> list[dict]:
        return [u.record() for u in sorted(self.users.values(), key=lambda u: u.name)]

    # ------------------------------------------------------------------ vhosts
    def _vhost(self, name: str) -> dict:
        info = self.vhost_info.get(name)
        if info is None:
            raise NotFound(f"no such vhost '{name}'")
        return info

    def add_vhost(self, name: str, description: str = "", tags=None,
                  default_queue_type: str | None = None) -> None:
        """Create (or update the description/tags of) a vhost; durable."""
        name = model.name("name", name)
        if not isinstance(description, str):
            raise model.DefinitionError("description", "must be a string")
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            raise model.DefinitionError("tags", "must be a list of strings")
        info = self.vhost_info.get(name, {"description": "", "tags": [], "limits": {}})
        info = dict(info, description=description, tags=list(tags or info.get("tags", [])))
        if default_queue_type:
            info["default_queue_type"] = default_queue_type
        created = name not in self.services.vhosts
        self.vhost_info[name] = info
        self.services.create_vhost(name).default_queue_type = info.get("default_queue_type")
        self._save_vhost(name)
        if created:
            for callback in self.on_vhost_added:
                callback(name)

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost and everything in it: its connections are closed (320), its
        queues (with their messages) and exchanges deleted, permissions dropped."""
        if name not in self.vhost_info and name not in self.services.vhosts:
            raise NotFound(f"no such vhost '{name}'")
        vhost = self.services.vhosts.pop(name, None)
        self.vhost_info.pop(name, None)
        store = self.services.store
        if vhost is not None:
            for session in list(self.services.sessions):
                if session.vhost is vhost:
                    session.force_close(errors.connection_forced("vhost '%s' is deleted", name))
            for q in list(vhost.queues.values()):
                vhost.delete_queue(q, "vhost deleted")
            for xname in [x for x in vhost.exchanges if x and not x.startswith("amq.")]:
                vhost.delete_exchange(xname)
        store.delete_meta(KIND_VHOST, name)
        for key in [k for k in self.perms if k[1] == name]:
            del self.perms[key]
            store.delete_meta(KIND_PERMISSION, _pkey(*key))
        for key in [k for k in self.topic_perms if k[1] == name]:
            for exchange in self.topic_perms.pop(key):
                store.delete_meta(KIND_TOPIC, _pkey(*key, exchange))
        for key in [k for k in self._authz if k[1] == name]:
            self._authz[key].reload(None, None, None)
            del self._authz[key]
        for callback in self.on_vhost_deleted:
            callback(name)
        self._changed()

    def set_vhost_limits(self, name: str, limits: dict) -> None:
        """Set (merge) vhost limits: max-connections, max-queues (negative: no limit)."""
        info = self._vhost(name)
        merged = dict(info.get("limits", {}))
        merged.update(model.limits("limits", limits, model.VHOST_LIMITS))
        info["limits"] = merged
        self._save_vhost(name)

    def clear_vhost_limits(self, name: str, limit: str | None = None) -> None:
        info = self._vhost(name)
        info["limits"] = ({} if limit in (None, "all") else
                          {k: v for k, v in info.get("limits", {}).items() if k != limit})
        self._save_vhost(name)

    def list_vhosts(self) -> list[dict]:
        return [{"name": n, "description": i.get("description", ""), "tags": list(i.get("tags", [])),
                 "limits": dict(i.get("limits", {})),
                 **({"default_queue_type": i["default_queue_type"]}
                    if i.get("default_queue_type") else {})}
                for n, i in sorted(self.vhost_info.items())]

    # ------------------------------------------------------------------ permissions
    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        """Grant regexes (they must compile: DefinitionError names the field)."""
        self._user(user)
        self._vhost(vhost)
        p = Permission(model.pattern("configure", configure), model.pattern("write", write),
                       model.pattern("read", read))
        self.perms[(user, vhost)] = p
        self.services.store.save_meta(KIND_PERMISSION, _pkey(user, vhost), p.record(user, vhost))
        self._changed(user)

    def clear_permissions(self, user: str, vhost: str) -> None:
        if self.perms.pop((user, vhost), None) is None:
            raise NotFound(f"no permissions for user '{user}' in vhost '{vhost}'")
        self.services.store.delete_meta(KIND_PERMISSION, _pkey(user, vhost))
        self._changed(user)

    def list_permissions(self, user: str | None = None, vhost: str | None = None) -> list[dict]:
        return [p.record(u, v) for (u, v), p in sorted(self.perms.items())
                if (user is None or u == user) and (vhost is None or v == vhost)]

    def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: str,
                              read: str) -> None:
        self._user(user)
        self._vhost(vhost)
        tp = TopicPermission(model.name("exchange", exchange), model.pattern("write", write),
                             model.pattern("read", read))
        self.topic_perms.setdefault((user, vhost), {})[exchange] = tp
        self.services.store.save_meta(KIND_TOPIC, _pkey(user, vhost, exchange), tp.record(user, vhost))
        self._changed(user)

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        perms = self.topic_perms.get((user, vhost))
        if not perms or (exchange is not None and exchange not in perms):
            raise NotFound(f"no topic permissions for user '{user}' in vhost '{vhost}'")
        for x in [exchange] if exchange is not None else list(perms):
            del perms[x]
            self.services.store.delete_meta(KIND_TOPIC, _pkey(user, vhost, x))
        if not perms:
            del self.topic_perms[(user, vhost)]
        self._changed(user)

    def list_topic_permissions(self, user: str | None = None, vhost: str | None = None) -> list[dict]:
        return [tp.record(u, v) for (u, v), perms in sorted(self.topic_perms.items())
                for tp in perms.values()
                if (user is None or u == user) and (vhost is None or v == vhost)]

    # ------------------------------------------------------------------ definitions
    def export(self) -> dict:
        from .definitions import export
        return export(self)

    def validate(self, defs: dict):
        """Check ``defs`` (users, vhosts, permissions, topic_permissions, vhost-limits
        parameters); raises DefinitionError naming the field. Returns the import plan."""
        from .definitions import validate
        return validate(self, defs)

    def import_(self, defs: dict) -> None:
        """Validate everything, then apply (all or nothing); raises DefinitionError."""
        from .definitions import apply
        apply(self, self.validate(defs))
