"""The wire contract of half messages: header names, validation, the check-back schedule.

A half message is any ``basic.publish`` whose headers carry ``x-transaction: prepare``;
its ``message_id`` property is the transaction id. Decisions are publishes to the
reserved exchange ``amq.triomq.transaction`` with routing key ``commit`` or
``rollback`` and the transaction id as ``message_id`` (or header ``x-transaction-id``).
Everything here is pure: it raises ``TransactionError`` (rendered as 406 by the
publish hook) and never touches the broker. See docs/transactions.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..queues.queue import Queue

CONTROL_EXCHANGE = "amq.triomq.transaction"
COMMIT = "commit"
ROLLBACK = "rollback"
DECISIONS = (COMMIT, ROLLBACK)

X_TRANSACTION = "x-transaction"            # "prepare" on a half message
X_TIMEOUT = "x-transaction-timeout"        # ms before the first check-back
X_CHECK_MAX = "x-transaction-check-max"    # check-backs before the default applies
X_DEFAULT = "x-transaction-default"        # "rollback" (default) or "commit"
X_ID = "x-transaction-id"                  # on a decision without message_id
X_CHECK = "x-transaction-check"            # on a check-back: its number, from 1
X_EXCHANGE = "x-transaction-exchange"      # on a check-back: where the half message goes
X_ROUTING_KEY = "x-transaction-routing-key"
PREPARED_AT = "x-triomq-prepared-at"       # stored copy only: wall clock ms of the prepare

PREPARE = "prepare"
# RocketMQ: transactionTimeout 6 s, transactionCheckMax 15 (then the message is discarded)
DEFAULT_TIMEOUT_MS = 6000
DEFAULT_CHECK_MAX = 15
BACKOFF_CAP_MS = 60_000                    # a check-back interval never grows past this ...
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000      # ... unless the timeout itself is longer
MAX_CHECKS = 1000

_INT_RE = re.compile(r"^\s*\d+\s*$")


class TransactionError(ValueError):
    """Bad input on a half message or a decision: the text becomes a 406's explanation."""


def text(value) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool):
        n = None
    elif isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        s = text(value)
        n = int(s) if s is not None and _INT_RE.match(s) else None
    if n is None or not low <= n <= high:
        raise TransactionError(f"invalid header '{name}': expected an integer from {low} to "
                               f"{high}, got {text(value) if text(value) is not None else value!r}")
    return n


@dataclass(frozen=True, slots=True)
class Policy:
    """When to ask the producer, how often, and what to do when it never answers."""
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    check_max: int = DEFAULT_CHECK_MAX
    # None: each destination queue applies its own (``queue_default``), rollback unless set
    default: str | None = None

    def delay_ms(self, attempt: int) -> int:
        """The wait before ``attempt`` (1-based), counted from the previous attempt.

        Attempts 1..check_max are check-backs, attempt check_max + 1 applies the
        default. The wait doubles from ``timeout_ms`` up to ``BACKOFF_CAP_MS`` (or the
        timeout, if that is longer): 6 s, 12 s, 24 s, 48 s, 60 s, 60 s ...
        """
        cap = max(self.timeout_ms, BACKOFF_CAP_MS)
        if attempt > 40:
            return cap
        return min(self.timeout_ms << (attempt - 1), cap)

    def due_ms(self, attempt: int) -> int:
        """Time of ``attempt`` after the prepare (sum of the waits up to it)."""
        return sum(self.delay_ms(k) for k in range(1, attempt + 1))

    @property
    def final_attempt(self) -> int:
        return self.check_max + 1


def parse_prepare(headers: dict, message_id) -> tuple[str, Policy]:
    """The transaction id and policy of a half message; raises TransactionError."""
    mode = text(headers.get(X_TRANSACTION))
    if mode != PREPARE:
        hint = (f"; decisions are publishes to exchange '{CONTROL_EXCHANGE}' with routing key "
                f"'commit' or 'rollback'" if mode in DECISIONS else "")
        raise TransactionError(f"invalid header '{X_TRANSACTION}': expected '{PREPARE}', got "
                               f"{mode if mode is not None else headers.get(X_TRANSACTION)!r}{hint}")
    txid = text(message_id)
    if not txid:
        raise TransactionError(f"missing property 'message_id' (the transaction id) on a message "
                               f"with header '{X_TRANSACTION}'")
    return txid, parse_policy(headers)


def parse_policy(headers: dict) -> Policy:
    timeout = DEFAULT_TIMEOUT_MS
    if X_TIMEOUT in headers:
        timeout = _int(X_TIMEOUT, headers[X_TIMEOUT], 1, MAX_TIMEOUT_MS)
    check_max = DEFAULT_CHECK_MAX
    if X_CHECK_MAX in headers:
        check_max = _int(X_CHECK_MAX, headers[X_CHECK_MAX], 0, MAX_CHECKS)
    default = None
    if X_DEFAULT in headers:
        default = text(headers[X_DEFAULT]) or ""
        if default not in DECISIONS:
            raise TransactionError(f"invalid header '{X_DEFAULT}': expected 'commit' or "
                                   f"'rollback', got {default or headers[X_DEFAULT]!r}")
    return Policy(timeout, check_max, default)


def default_argument(name: str, value) -> str:
    """Validator of the queue argument ``x-transaction-default``: what this queue does with
    a half message whose producer never answered (when the message does not say)."""
    from ..queues.args import ArgumentError, amqp_type_name

    decision = text(value)
    if decision is None:
        raise ArgumentError(name, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    if decision not in DECISIONS:
        raise ArgumentError(name, f"{{unknown_value,{decision!r}}}: expected 'commit' or 'rollback'")
    return decision


def queue_default(queue: Queue) -> str:
    """A destination queue's default decision: its ``x-transaction-default``, else rollback."""
    return queue.opts.extra.get(X_DEFAULT) or ROLLBACK


def parse_decision(routing_key: str, headers: dict, message_id) -> tuple[str, str]:
    """(decision, transaction id) of a publish to the control exchange; raises TransactionError."""
    if routing_key not in DECISIONS:
        raise TransactionError(f"invalid routing key '{routing_key}' for exchange "
                               f"'{CONTROL_EXCHANGE}': expected 'commit' or 'rollback'")
    txid = text(message_id) or text(headers.get(X_ID))
    if not txid:
        raise TransactionError(f"missing property 'message_id' (or header '{X_ID}'): the id of "
                               f"the transaction to {routing_key}")
    return routing_key, txid


def is_transaction_header(name: str) -> bool:
    """Headers of this contract, never shown to consumers of the committed message."""
    return name in (X_TRANSACTION, PREPARED_AT) or name.startswith("x-transaction-")
