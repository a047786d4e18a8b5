"""The three shapes of a half message: as stored, as committed, as a check-back.

* stored: the published message plus ``x-triomq-prepared-at`` (wall clock ms), so a
  restart can resume the check-back schedule from the stored message alone;
* committed: what consumers get, the ``x-transaction*`` headers stripped, routed through
  the original exchange and routing key;
* check-back: sent to the producer's ``reply_to`` through the default exchange, with
  ``x-transaction-check: n``, where the message was going, and the transaction id as
  ``message_id`` and ``correlation_id``.
"""
from __future__ import annotations

from ..message import Message
from .spec import PREPARED_AT, X_CHECK, X_EXCHANGE, X_ROUTING_KEY, is_transaction_header


def _app_headers(message: Message) -> dict:
    return {k: v for k, v in message.headers.items() if not is_transaction_header(k)}


def stored_copy(message: Message, prepared_at_ms: int) -> Message:
    headers = dict(message.headers)
    headers[PREPARED_AT] = prepared_at_ms
    return message.with_changes(properties={**message.properties, "headers": headers})


def prepared_at_ms(message: Message) -> int | None:
    value = message.headers.get(PREPARED_AT)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def committed_copy(message: Message) -> Message:
    props = dict(message.properties)
    headers = _app_headers(message)
    if headers:
        props["headers"] = headers
    else:
        props.pop("headers", None)
    return message.with_changes(properties=props)


def check_copy(message: Message, txid: str, attempt: int, ttl_ms: int) -> Message:
    """A check-back for the producer; it expires when the next one is due (stale
    checks do not pile up in a reply queue whose consumer is down)."""
    headers = _app_headers(message)
    headers[X_CHECK] = attempt
    headers[X_EXCHANGE] = message.exchange
    headers[X_ROUTING_KEY] = message.routing_key
    props = dict(message.properties)
    props.update(headers=headers, message_id=txid, correlation_id=txid, expiration=str(ttl_ms))
    return message.with_changes(exchange="", routing_key=props["reply_to"], properties=props)
