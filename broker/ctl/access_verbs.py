"""ctl verbs for users, virtual hosts and permissions (rabbitmqctl's names, arguments
and banners). Does not talk HTTP itself (``core.Api``) nor parse the command line."""
from __future__ import annotations

from argparse import Namespace
from typing import Any

from .core import (
    EX_DATAERR,
    EX_NOUSER,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    Api,
    CtlError,
    Rows,
    Verb,
    columns,
    exists,
    json_arg,
    need_user,
    need_vhost,
    q,
    register,
    vhost_missing,
)


def _user_verbs() -> None:
    def add_user(api: Api, a: Namespace) -> None:
        existing = exists(api, "/users/" + q(a.username))
        if existing:
            raise CtlError(f'User "{a.username}" already exists', EX_SOFTWARE)
        api.call("PUT", "/users/" + q(a.username), {"password": a.password, "tags": ""})

    def delete_user(api: Api, a: Namespace) -> None:
        api.call("DELETE", "/users/" + q(a.username),
                 not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    def change_password(api: Api, a: Namespace) -> None:
        user = api.get("/users/" + q(a.username),
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        api.call("PUT", "/users/" + q(a.username),
                 {"password": a.password, "tags": user.get("tags", [])})

    def authenticate_user(api: Api, a: Namespace) -> str:
        r = api.client.get("/api/whoami", auth=(a.username, a.password))
        if r.status_code == 401 and "Login failed" in r.text:
            raise CtlError(f'Error: failed to authenticate user "{a.username}"\n'
                           f"user '{a.username}' - invalid credentials", EX_DATAERR)
        if r.status_code >= 400 and r.status_code != 401:
            raise CtlError(f"HTTP {r.status_code}", EX_SOFTWARE)
        return "Success"

    def set_user_tags(api: Api, a: Namespace) -> None:
        user = api.get("/users/" + q(a.username),
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        body = {"password_hash": user["password_hash"],
                "hashing_algorithm": user.get("hashing_algorithm"), "tags": ",".join(a.tags)}
        api.call("PUT", "/users/" + q(a.username), body)

    def list_users(api: Api, a: Namespace) -> Rows:
        return ["user", "tags"], [{"user": u["name"], "tags": u["tags"]}
                                  for u in api.get("/users")]

    def set_user_limits(api: Api, a: Namespace) -> None:
        limits = json_arg(a.definition, "limits")
        for name, value in limits.items():
            api.call("PUT", f"/user-limits/{q(a.username)}/{q(name)}", {"value": value},
                     not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    register(Verb("add_user", "Creates a new user", add_user,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Adding user "{a.username}" ...'))
    register(Verb("delete_user", "Removes a user", delete_user, [("username", {})],
                  banner=lambda a: f'Deleting user "{a.username}" ...'))
    register(Verb("change_password", "Changes the user password", change_password,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Changing password for user "{a.username}" ...'))
    register(Verb("authenticate_user", "Attempts to authenticate a user", authenticate_user,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Authenticating user "{a.username}" ...'))
    register(Verb("set_user_tags", "Sets user tags", set_user_tags,
                  [("username", {}), ("tags", {"nargs": "*"})],
                  banner=lambda a: f'Setting tags for user "{a.username}" to [{", ".join(a.tags)}] ...'))
    register(Verb("list_users", "List user names and tags", list_users,
                  banner=lambda a: "Listing users ..."))
    register(Verb("set_user_limits", "Sets user limits", set_user_limits,
                  [("username", {}), ("definition", {})],
                  banner=lambda a: f'Setting user limits to "{a.definition}" for user '
                                   f'"{a.username}" ...'))


def _vhost_verbs() -> None:
    def add_vhost(api: Api, a: Namespace) -> None:
        body: dict[str, Any] = {}
        if a.description:
            body["description"] = a.description
        if a.tags:
            body["tags"] = a.tags
        if a.default_queue_type:
            body["default_queue_type"] = a.default_queue_type
        api.call("PUT", "/vhosts/" + q(a.vhost_name), body)

    def delete_vhost(api: Api, a: Namespace) -> None:
        api.call("DELETE", "/vhosts/" + q(a.vhost_name),
                 not_found=(f"Virtual host {a.vhost_name} does not exist", EX_UNAVAILABLE))

    def list_vhosts(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["name"], {"name", "description", "tags", "tracing",
                                      "cluster_state", "default_queue_type"})
        return cols, api.get("/vhosts")

    def set_vhost_limits(api: Api, a: Namespace) -> None:
        limits = json_arg(a.definition, "limits")
        for name, value in limits.items():
            api.call("PUT", f"/vhost-limits/{q(a.vhost)}/{q(name)}", {"value": value},
                     not_found=vhost_missing(a.vhost))

    register(Verb("add_vhost", "Creates a virtual host", add_vhost, [
        ("vhost_name", {}), ("--description", {"default": ""}), ("--tags", {"default": ""}),
        ("--default-queue-type", {"default": None})],
        banner=lambda a: f'Adding vhost "{a.vhost_name}" ...'))
    register(Verb("delete_vhost", "Deletes a virtual host", delete_vhost, [("vhost_name", {})],
                  banner=lambda a: f'Deleting vhost "{a.vhost_name}" ...'))
    register(Verb("list_vhosts", "Lists virtual hosts", list_vhosts,
                  [("columns", {"nargs": "*"})], banner=lambda a: "Listing vhosts ..."))
    register(Verb("set_vhost_limits", "Sets virtual host limits", set_vhost_limits,
                  [("definition", {})], vhost=True,
                  banner=lambda a: f'Setting vhost limits to "{a.definition}" for vhost '
                                   f'"{a.vhost}" ...'))


def _permission_verbs() -> None:
    def set_permissions(api: Api, a: Namespace) -> None:
        need_vhost(api, a.vhost)
        need_user(api, a.username)
        api.call("PUT", f"/permissions/{q(a.vhost)}/{q(a.username)}",
                 {"configure": a.conf, "write": a.write, "read": a.read})

    def clear_permissions(api: Api, a: Namespace) -> None:
        need_vhost(api, a.vhost)
        need_user(api, a.username)
        try:
            api.call("DELETE", f"/permissions/{q(a.vhost)}/{q(a.username)}")
        except CtlError as exc:
            if exc.status != EX_DATAERR:
                raise  # RabbitMQ: clearing absent permissions succeeds

    def list_permissions(api: Api, a: Namespace) -> Rows:
        rows = api.get(f"/vhosts/{q(a.vhost)}/permissions", not_found=vhost_missing(a.vhost))
        return ["user", "configure", "write", "read"], rows

    def list_user_permissions(api: Api, a: Namespace) -> Rows:
        rows = api.get(f"/users/{q(a.username)}/permissions",
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        return ["vhost", "configure", "write", "read"], rows

    def set_topic_permissions(api: Api, a: Namespace) -> None:
        need_vhost(api, a.vhost)
        need_user(api, a.username)
        api.call("PUT", f"/topic-permissions/{q(a.vhost)}/{q(a.username)}",
                 {"exchange": a.exchange, "write": a.write, "read": a.read})

    def list_topic_permissions(api: Api, a: Namespace) -> Rows:
        rows = api.get(f"/vhosts/{q(a.vhost)}/topic-permissions",
                       not_found=vhost_missing(a.vhost))
        return ["user", "exchange", "write", "read"], rows

    register(Verb("set_permissions", "Sets user permissions for a vhost", set_permissions,
                  [("username", {}), ("conf", {}), ("write", {}), ("read", {})], vhost=True,
                  banner=lambda a: f'Setting permissions for user "{a.username}" in vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("clear_permissions", "Revokes user permissions for a vhost",
                  clear_permissions, [("username", {})], vhost=True,
                  banner=lambda a: f'Clearing permissions for user "{a.username}" in vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("list_permissions", "Lists user permissions in a virtual host",
                  list_permissions, vhost=True,
                  banner=lambda a: f'Listing permissions for vhost "{a.vhost}" ...'))
    register(Verb("list_user_permissions", "Lists permissions of a user across all vhosts",
                  list_user_permissions, [("username", {})],
                  banner=lambda a: f'Listing permissions for user "{a.username}" ...'))
    register(Verb("set_topic_permissions", "Sets topic permission for an exchange",
                  set_topic_permissions,
                  [("username", {}), ("exchange", {}), ("write", {}), ("read", {})],
                  vhost=True,
                  banner=lambda a: f'Setting topic permissions on "{a.exchange}" for user '
                                   f'"{a.username}" in vhost "{a.vhost}" ...'))
    register(Verb("list_topic_permissions", "Lists topic permissions in a virtual host",
                  list_topic_permissions, vhost=True,
                  banner=lambda a: f'Listing topic permissions for vhost "{a.vhost}" ...'))


for _group in (_user_verbs, _vhost_verbs, _permission_verbs):
    _group()
