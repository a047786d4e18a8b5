"""The security model, as RabbitMQ's: users, vhosts, permissions, topic permissions,
limits (``broker.access``, an ``AccessControl``), and TLS (``tls``).

API of ``broker.access`` (all synchronous, on the event loop's thread)::

    # authentication
    user(name) -> User | None
    authenticate(username, password, peer_host=None) -> User | None
        # None for a wrong password, an unknown user or a loopback-only user from
        # elsewhere (never says which); callers answer a refusal only after
        # ``access.failure_delay`` seconds, sleeping in their own task.
    login(mechanism, response, peer_host, peer_cert_user=None) -> (User | None, refusal)
        # AMQP start-ok: PLAIN, AMQPLAIN, EXTERNAL (peer_cert_user = client cert CN)
    # checks (errors from broker/errors.py with RabbitMQ's codes and texts)
    check_vhost(user, vhost_name)                      # 530 NOT_ALLOWED
    check(user, vhost_name, kind, name, perm)          # 403; kind "exchange" | "queue",
                                                       # perm "configure" | "write" | "read"
    check_topic(user, vhost_name, exchange, routing_key, perm)   # 403; perm "write" | "read"
    authz(user, vhost_name) -> Authz                   # the cached checks behind check*
    check_connection_limits(user, vhost_name, sessions)   # 530
    check_channel_limit(user, sessions)                # 530
    check_queue_limit(vhost, queue_name)               # 406
    # management (durable through the store's metadata seam; bad input raises
    # model.DefinitionError(field, message) -> HTTP 400, a missing user/vhost/permission
    # model.NotFound -> HTTP 404)
    put_user(name, password=None, password_hash=None, hashing_algorithm=None, tags=None,
             limits=None) -> User                      # PUT /api/users/NAME semantics
    add_user(name, password, tags=None), delete_user(name), change_password(name, pw),
    clear_password(name), set_user_tags(name, tags), set_user_limits(name, limits),
    clear_user_limits(name, limit=None), list_users() -> [dict]
    add_vhost(name, description="", tags=None, default_queue_type=None), delete_vhost(name),
    set_vhost_limits(name, limits), clear_vhost_limits(name, limit=None),
    list_vhosts() -> [dict]
    set_permissions(user, vhost, configure, write, read), clear_permissions(user, vhost),
    list_permissions(user=None, vhost=None) -> [dict]
    set_topic_permissions(user, vhost, exchange, write, read),
    clear_topic_permissions(user, vhost, exchange=None),
    list_topic_permissions(user=None, vhost=None) -> [dict]
    # definitions (RabbitMQ's JSON: users, vhosts, permissions, topic_permissions and the
    # "vhost-limits" parameters; other keys belong to other features)
    export() -> dict; validate(defs) -> plan; import_(defs)   # all or nothing
    # hooks: on_vhost_added / on_vhost_deleted (callbacks(vhost name)), on_change (callbacks())
    failure_delay: float; loopback_users: set[str]; users / vhost_info / perms / topic_perms

Stored metadata kinds: "user", "vhost", "permission", "topic_permission", "access".
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .access import AccessControl
from .model import TAGS, DefinitionError, NotFound, Permission, TopicPermission, User

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import AccessServices

__all__ = ["TAGS", "AccessControl", "DefinitionError", "NotFound", "Permission",
           "TopicPermission", "User", "install"]


def install(broker: Broker, services: AccessServices) -> AccessControl:
    """Create ``broker.access`` from the broker's config (default user, loopback users), on
    ``services``; its stored records come back through ``broker.meta_restorers``."""
    config = broker.config
    access = AccessControl(services, default_user=config.default_user,
                           default_pass=config.default_pass,
                           loopback_users=tuple(config.loopback_users),
                           failure_delay=config.auth_failure_delay)
    broker.access = access
    broker.meta_restorers.update(access.restorers())
    broker.recovery_hooks.append(access.recovered)
    if config.oauth2_resource_server_id:
        from functools import partial

        from .oauth2 import OAuth2, OAuth2Config
        access.oauth2 = OAuth2(OAuth2Config(
            resource_server_id=config.oauth2_resource_server_id,
            scope_prefix=config.oauth2_scope_prefix,
            signing_keys=dict(config.oauth2_signing_keys),
            default_key=config.oauth2_default_key,
            jwks_url=config.oauth2_jwks_url,
            preferred_username_claims=tuple(config.oauth2_preferred_username_claims),
            extra_scopes_source=config.oauth2_extra_scopes_source,
            verify_aud=config.oauth2_verify_aud,
            introspection_url=config.oauth2_introspection_url,
            introspection_client_id=config.oauth2_introspection_client_id,
            introspection_client_secret=config.oauth2_introspection_client_secret))
        broker.background_tasks.append(partial(access.oauth2.run, broker))
    path = config.load_definitions
    if path:
        def load() -> None:
            from .definitions import read_definitions
            access.import_(read_definitions(path))
        broker.recovery_hooks.append(load)
    return access
