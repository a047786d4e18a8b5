"""STOMP destinations and headers as the broker's exchanges, queues and AMQP 0-9-1
properties, as RabbitMQ's STOMP plugin maps them (docs/stomp.md), and the ERROR a failure
becomes. Pure functions: not the session's state (``stomp_session``) nor the frames
(``broker.stomp``).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from .. import errors
from ..message import Message

# SEND headers that are the frame's own, not the message's
_FRAME_HEADERS = frozenset({"destination", "content-length", "transaction", "receipt",
                            "persistent", "content-type", "content-encoding", "priority",
                            "correlation-id", "reply-to", "expiration", "amqp-message-id",
                            "timestamp", "type", "user-id", "app-id", "message-id"})
# STOMP header -> AMQP property (strings)
_STR_PROPS = {"content-type": "content_type", "content-encoding": "content_encoding",
              "correlation-id": "correlation_id", "reply-to": "reply_to",
              "expiration": "expiration", "amqp-message-id": "message_id", "type": "type",
              "user-id": "user_id", "app-id": "app_id"}
_INT_PROPS = {"priority": "priority", "timestamp": "timestamp"}
# the ActiveMQ scheduler's headers are numbers in the AMQP headers table
_NUMERIC_HEADERS = frozenset({"AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD",
                              "AMQ_SCHEDULED_REPEAT", "x-delay"})
VALID_DESTINATIONS = ("'%s' is not a valid destination.\nValid destination types are: "
                      "/temp-queue, /exchange, /topic, /queue, /amq/queue, /reply-queue/.\n")


class StompError(Exception):
    """An ERROR frame (``message`` header, ``detail`` body); the connection closes."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.message = message
        self.detail = detail


def amqp_error(exc: errors.AMQPError) -> StompError:
    # as RabbitMQ's plugin: the error's name in lower case, the AMQP reply text as body
    return StompError(exc.name.lower() if exc.name else "error", exc.text)


def parse_destination(destination: str | None, command: str) -> tuple[str, str, str]:
    """(kind, exchange or queue name, routing key) of a destination."""
    if destination is None:
        raise StompError("Missing destination",
                         f'"{command}" must include a \'destination\' header\n')
    for prefix, kind in (("/amq/queue/", "amq-queue"), ("/queue/", "queue"),
                         ("/topic/", "topic"), ("/temp-queue/", "temp-queue"),
                         ("/reply-queue/", "reply-queue")):
        if destination.startswith(prefix):
            name = destination[len(prefix):]
            if name:
                return kind, name, name
    if destination.startswith("/exchange/"):
        rest = destination[len("/exchange/"):]
        exchange, _, key = rest.partition("/")
        if exchange:
            return "exchange", exchange, key
    raise StompError("Unknown destination", VALID_DESTINATIONS % destination)


def message_properties(h: dict, temp_queue: Callable[[str], Any]) -> dict:
    """A SEND's headers as AMQP properties (``temp_queue``: the queue of a /temp-queue/)."""
    props: dict[str, Any] = {}
    for header, prop in _STR_PROPS.items():
        value = h.get(header)
        if value is not None:
            props[prop] = value
    for header, prop in _INT_PROPS.items():
        value = h.get(header)
        if value is not None:
            try:
                props[prop] = int(value)
            except ValueError:
                raise StompError("Invalid header",
                                 f"'{header}' must be an integer: '{value}'\n") from None
    reply_to = props.get("reply_to")
    if isinstance(reply_to, str) and reply_to.startswith("/temp-queue/"):
        props["reply_to"] = "/reply-queue/" + temp_queue(
            reply_to[len("/temp-queue/"):]).name
    if h.get("persistent", "").lower() == "true":
        props["delivery_mode"] = 2
    headers: dict[str, Any] = {}
    for k, v in h.items():
        if k in _FRAME_HEADERS:
            continue
        if k in _NUMERIC_HEADERS:
            try:
                headers[k] = int(v)
                continue
            except ValueError:
                pass
        headers[k] = v
    if headers:
        props["headers"] = headers
    return props


def is_host_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def int_header(h: dict, name: str) -> int | None:
    value = h.get(name)
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise StompError("Invalid header", f"'{name}' must be an integer: '{value}'\n") from None
    return n if n > 0 else None


def queue_arguments(h: dict) -> dict:
    """``x-*`` headers of SEND/SUBSCRIBE as queue arguments (numbers as numbers)."""
    args: dict[str, Any] = {}
    for k, v in h.items():
        if k.startswith("x-") and k not in ("x-delay",):
            try:
                n = int(v)
            except ValueError:
                args[k] = v
                continue
            # no AMQP field holds more: a durable queue's arguments could not be stored
            if not -(1 << 63) <= n < 1 << 63:
                raise StompError("Invalid header",
                                 f"'{k}' is out of the signed 64-bit range: '{v[:40]}'\n")
            args[k] = n
    return args


def delivery_number(ack_id: str | None) -> int | None:
    if not ack_id:
        return None
    try:
        return int(ack_id.rsplit("@@", 1)[1])
    except (IndexError, ValueError):
        return None


def destination_of(message: Message) -> str:
    exchange = message.exchange
    if exchange == "":
        return "/queue/" + message.routing_key
    if exchange == "amq.topic":
        return "/topic/" + message.routing_key
    return f"/exchange/{exchange}/{message.routing_key}"


def message_headers(props: dict, headers: dict) -> None:
    """AMQP properties as MESSAGE headers, as RabbitMQ's plugin maps them."""
    table = props.get("headers")
    if table:
        for k, v in table.items():
            if k in headers:
                continue
            if isinstance(v, (bytes, bytearray)):
                v = bytes(v).decode("utf-8", "replace")
            elif isinstance(v, bool):
                v = "true" if v else "false"
            elif not isinstance(v, (str, int, float)):
                continue  # tables and arrays have no STOMP form (RabbitMQ drops them too)
            headers[str(k)] = str(v)
    for header, prop in _STR_PROPS.items():
        value = props.get(prop)
        if value is not None:
            headers[header] = str(value)
    reply_to = headers.get("reply-to")
    if reply_to is not None and not reply_to.startswith("/"):
        headers["reply-to"] = "/reply-queue/" + reply_to  # an AMQP reply queue's name
    for header, prop in _INT_PROPS.items():
        value = props.get(prop)
        if value is not None:
            headers[header] = str(value)
    if props.get("delivery_mode") == 2:
        headers["persistent"] = "true"
