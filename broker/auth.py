"""Authentication mechanisms and the user database.

Only guest/guest exists for now, accepted from loopback only as RabbitMQ's
``loopback_users`` default does. Users, permissions and TLS plug in here.
"""
from __future__ import annotations

import ipaddress
import struct

from .amqp.connection import Authenticator
from .amqp.fields import FieldError, decode_table


class UserDatabase:
    def __init__(self, users: dict[str, str] | None = None, loopback_only: set[str] | None = None):
        self.users = dict(users or {"guest": "guest"})
        self.loopback_only = set(loopback_only if loopback_only is not None else {"guest"})

    def check(self, username: str, password: str, peer_host: str | None) -> str | None:
        """None when accepted, else RabbitMQ's explanation of the refusal (403 ACCESS_REFUSED)."""
        if self.users.get(username) != password:
            return ("Login was refused using authentication mechanism PLAIN. "
                    "For details see the broker logfile.")
        if username in self.loopback_only and not _is_loopback(peer_host):
            return ("Login was refused using authentication mechanism PLAIN. "
                    "For details see the broker logfile.")
        return None


def _is_loopback(host: str | None) -> bool:
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


def make_authenticator(users: UserDatabase, peer_host: str | None) -> Authenticator:
    def authenticate(mechanism: str, response: bytes) -> tuple[str | None, str]:
        if mechanism not in ("PLAIN", "AMQPLAIN"):
            return None, (f"unsupported authentication mechanism '{mechanism}'")
        creds = parse_credentials(mechanism, response)
        if creds is None:
            return None, ""  # RabbitMQ drops the socket without a close
        failure = users.check(creds[0], creds[1], peer_host)
        if failure is not None:
            return None, failure.replace("mechanism PLAIN", f"mechanism {mechanism}")
        return creds[0], ""
    return authenticate
