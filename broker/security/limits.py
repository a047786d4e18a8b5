"""The limits a connection, channel or queue declaration is checked against: a vhost's
max-connections and max-queues, a user's max-connections and max-channels. ``Limits`` is a
part of ``AccessControl``; setting and clearing limits is in access (they are stored with
the user or vhost)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import errors
from .model import User

if TYPE_CHECKING:
    from ..listeners.amqp_session import Session
    from ..listeners.session_base import ProtocolSession
    from ..vhost import VirtualHost


class Limits:
    """The limit checks of ``AccessControl`` (which sets these attributes)."""

    users: dict[str, User]
    vhost_info: dict[str, dict[str, Any]]

    def check_connection_limits(self, user: User, vhost_name: str,
                                sessions: Iterable[Session | ProtocolSession]) -> None:
        """530 NOT_ALLOWED if opening one more connection of ``user`` on ``vhost_name``
        passes the vhost's or the user's max-connections (``sessions``: the open ones)."""
        vlimit = self.vhost_info.get(vhost_name, {}).get("limits", {}).get("max-connections", -1)
        if vlimit >= 0:
            n = sum(1 for s in sessions if s.vhost is not None and s.vhost.name == vhost_name)
            if n >= vlimit:
                raise errors.not_allowed(
                    "access to vhost '%s' refused for user '%s': connection limit (%d) is reached",
                    vhost_name, user.name, vlimit)
        user = self.users.get(user.name, user)
        ulimit = user.limits.get("max-connections", -1)
        if ulimit >= 0:
            n = sum(1 for s in sessions if s.user is not None
                    and s.user.name == user.name)
            if n >= ulimit:
                raise errors.not_allowed(
                    "connection refused for user '%s': user connection limit (%d) is reached",
                    user.name, ulimit)

    def check_channel_limit(self, user: User,
                            sessions: Iterable[Session | ProtocolSession]) -> None:
        """530 NOT_ALLOWED if the user's channels (the one just opened included) pass
        their max-channels."""
        user = self.users.get(user.name, user)
        limit = user.limits.get("max-channels", -1)
        if limit < 0:
            return
        n = sum(len(s.channels) for s in sessions
                if s.user is not None and s.user.name == user.name)
        if n > limit:
            raise errors.not_allowed("number of channels opened for user '%s' has reached the "
                                     "maximum allowed user limit of (%d)", user.name, limit)

    def check_queue_limit(self, vhost: VirtualHost, name: str) -> None:
        """406 PRECONDITION_FAILED if declaring the new queue ``name`` passes the vhost's
        max-queues."""
        limit = self.vhost_info.get(vhost.name, {}).get("limits", {}).get("max-queues", -1)
        if limit < 0:
            return
        if sum(1 for q in vhost.queues.values() if not q.internal) >= limit:
            raise errors.precondition_failed(
                "cannot declare queue '%s': queue limit in vhost '%s' (%d) is reached",
                name, vhost.name, limit)

