"""What the security model is made of (users, permissions, limits) and the validation of
every field that comes from outside (management API, definitions, command line), apart
from the behaviour in ``access``. Bad input raises ``DefinitionError`` naming the field."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .passwords import SHA256, check_hash

#: The tags RabbitMQ gives a meaning to; any other is refused.
TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")
VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")
NAME_MAX = 255  # bytes of UTF-8, as an AMQP shortstr


class DefinitionError(ValueError):
    """Bad input: ``field`` names what is wrong (``users[2].tags``, ``configure``), ``str()``
    is one line for a 400 body or the command line."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(LookupError):
    """A user, vhost or permission named by a management call does not exist (404)."""


@dataclass
class User:
    name: str
    password_hash: str = ""  # "" = no password login (certificates only)
    hashing_algorithm: str = SHA256
    tags: tuple[str, ...] = ()
    limits: dict = field(default_factory=dict)
    # SCRAM-SHA-256 credentials (``passwords.scram_credentials``), made when a password is
    # set; None for a user made from a hash (no SCRAM login: it cannot be derived)
    scram: dict | None = None

    @property
    def is_administrator(self) -> bool:
        return "administrator" in self.tags

    @property
    def is_impersonator(self) -> bool:
        return "impersonator" in self.tags

    def record(self) -> dict:
        """The definitions form (RabbitMQ's users[] entry)."""
        return {"name": self.name, "password_hash": self.password_hash,
                "hashing_algorithm": self.hashing_algorithm, "tags": list(self.tags),
                "limits": dict(self.limits)}

    def stored(self) -> dict:
        """The stored form: the definitions form and, when there are some, the SCRAM
        credentials (kept out of exports, which RabbitMQ reads)."""
        record = self.record()
        if self.scram is not None:
            record["scram_sha256"] = dict(self.scram)
        return record


@dataclass
class Permission:
    configure: str
    write: str
    read: str

    def record(self, user: str, vhost: str) -> dict:
        return {"user": user, "vhost": vhost, "configure": self.configure, "write": self.write,
                "read": self.read}


@dataclass
class TopicPermission:
    exchange: str
    write: str
    read: str

    def record(self, user: str, vhost: str) -> dict:
        return {"user": user, "vhost": vhost, "exchange": self.exchange, "write": self.write,
                "read": self.read}


# ---------------------------------------------------------------- validation
def name(field_name: str, value: object, allow_empty: bool = False) -> str:
    """A user, vhost or exchange name: a string of at most 255 UTF-8 bytes."""
    if not isinstance(value, str):
        raise DefinitionError(field_name, "must be a string")
    if not value and not allow_empty:
        raise DefinitionError(field_name, "must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise DefinitionError(field_name, "is not valid UTF-8") from None
    if size > NAME_MAX:
        raise DefinitionError(field_name, f"longer than {NAME_MAX} bytes")
    return value


def pattern(field_name: str, value: object) -> str:
    """A permission regular expression (must compile)."""
    if not isinstance(value, str):
        raise DefinitionError(field_name, "must be a string (a regular expression)")
    try:
        re.compile(value)
    except re.error as exc:
        raise DefinitionError(field_name, f"invalid regular expression {value!r}: {exc}") from None
    return value


def tags(field_name: str, value: object) -> tuple[str, ...]:
    """Tags as a list or RabbitMQ's comma-separated string; each one must be known."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [t.strip() for t in value.split(",") if t.strip()]
    elif isinstance(value, list) and all(isinstance(t, str) for t in value):
        items = [t.strip() for t in value if t.strip()]
    else:
        raise DefinitionError(field_name, "must be a list of strings or a comma-separated string")
    for t in items:
        if t not in TAGS:
            raise DefinitionError(field_name, f"unknown tag {t!r} (one of {', '.join(TAGS)})")
    return tuple(dict.fromkeys(items))


def limits(field_name: str, value: object, allowed: tuple[str, ...]) -> dict:
    """``{"max-connections": 10, ...}``: known keys, whole numbers; negative = no limit."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DefinitionError(field_name, "must be an object")
    out = {}
    for key, v in value.items():
        if key not in allowed:
            raise DefinitionError(f"{field_name}.{key}",
                                  f"unknown limit (one of {', '.join(allowed)})")
        if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise DefinitionError(f"{field_name}.{key}", "must be a whole number")
        out[key] = v
    return out


def password_hash(field_name: str, value: object, algorithm: object) -> tuple[str, str]:
    """(hash, algorithm) of an imported user; the algorithm defaults to sha256."""
    algorithm = SHA256 if algorithm in (None, "") else algorithm
    if not isinstance(algorithm, str):
        raise DefinitionError("hashing_algorithm", "must be a string")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise DefinitionError(field_name, "must be a string")
    problem = check_hash(value, algorithm)
    if problem is not None:
        which = "hashing_algorithm" if problem.startswith("unknown") else field_name
        raise DefinitionError(which, problem)
    return value, algorithm


def only_keys(field_name: str, value: object, allowed: set[str]) -> dict:
    """``value`` must be an object with no keys but ``allowed``."""
    if not isinstance(value, dict):
        raise DefinitionError(field_name, "must be an object")
    for key in value:
        if key not in allowed:
            raise DefinitionError(f"{field_name}.{key}" if field_name else key, "unknown key")
    return value
