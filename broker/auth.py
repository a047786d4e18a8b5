"""SASL response parsing (PLAIN, AMQPLAIN) for ``broker.access.login``.

Users, permissions and TLS live in broker/security (``broker.access``). ``UserDatabase``
is the guest/guest fallback of code that runs without ``broker.access``.
"""
from __future__ import annotations

import ipaddress
import struct

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
