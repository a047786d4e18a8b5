"""``python -m broker ctl`` verbs for Hermes topics and subscriptions, over the broker's
Hermes management routes (``/topics...`` on the management HTTP port).

Exit statuses as the other verbs: 65 refused input (400/409) or missing topic/subscription,
77 not authorised (401/403), 69 broker unreachable, 70 anything else.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from ..ctl import EX_DATAERR, EX_NOPERM, EX_SOFTWARE, EX_UNAVAILABLE, Api, CtlError, Verb, register


def call(api: Api, method: str, path: str, body: Any = None, content: bytes | None = None) -> Any:
    import httpx
    try:
        r = api.client.request(method, path, json=body, content=content)
    except httpx.HTTPError as exc:
        raise CtlError(f"unable to reach the broker at {api.url}: {exc}", EX_UNAVAILABLE) from None
    if r.status_code < 300:
        return r.json() if r.content else None
    code = None
    try:
        data = r.json()
        reason = data.get("message") or data.get("reason") or r.text
        code = data.get("code")
    except (ValueError, AttributeError):
        reason = r.text
    status = {400: EX_DATAERR, 404: EX_DATAERR, 409: EX_DATAERR, 413: EX_DATAERR,
              401: EX_NOPERM, 403: EX_NOPERM}.get(r.status_code, EX_SOFTWARE)
    if r.status_code == 403 and code not in (None, "FORBIDDEN"):
        status = EX_DATAERR  # refused for what it is (a topic with subscriptions), not who asks
    raise CtlError(str(reason), status)


def _topic_path(name: str) -> str:
    return "/topics/" + quote(name, safe="")


def list_topics(api: Api, a):
    rows = []
    for name in call(api, "GET", "/topics"):
        t = call(api, "GET", _topic_path(name))
        rows.append({"name": t["name"], "content_type": t["contentType"], "ack": t["ack"],
                     "max_message_size": t["maxMessageSize"], "schema_version": t["schemaVersion"],
                     "owner": t["owner"].get("id", "")})
    return ["name", "content_type", "ack", "max_message_size", "schema_version", "owner"], rows


def add_topic(api: Api, a):
    body: dict = {"name": a.name, "contentType": a.content_type, "ack": a.ack,
                  "description": a.description}
    if a.max_message_size is not None:
        body["maxMessageSize"] = a.max_message_size
    if a.owner:
        body["owner"] = {"source": "Plaintext", "id": a.owner}
    if a.schema_file:
        body["schema"] = _read(a.schema_file)
    call(api, "POST", "/topics", body)


def delete_topic(api: Api, a):
    call(api, "DELETE", _topic_path(a.name))


def set_topic_schema(api: Api, a):
    call(api, "POST", _topic_path(a.name) + "/schema", content=_read(a.schema_file).encode())


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CtlError(f"cannot read {path}: {exc.strerror or exc}", EX_DATAERR) from None


def list_subscriptions(api: Api, a):
    rows = []
    for name in call(api, "GET", _topic_path(a.topic) + "/subscriptions"):
        s = call(api, "GET", f"{_topic_path(a.topic)}/subscriptions/{quote(name, safe='')}")
        p = s["subscriptionPolicy"]
        rows.append({"name": s["name"], "endpoint": s["endpoint"], "state": s["state"],
                     "delivery_type": s["deliveryType"], "rate": p["rate"],
                     "inflight": p["inflightSize"], "ttl": p["messageTtl"], "ordered": p["ordered"]})
    return ["name", "endpoint", "state", "delivery_type", "rate", "inflight", "ttl", "ordered"], rows


def add_subscription(api: Api, a):
    policy: dict = {}
    for key, value in (("rate", a.rate), ("inflightSize", a.inflight), ("messageTtl", a.ttl),
                       ("messageBackoff", a.backoff), ("requestTimeout", a.request_timeout)):
        if value is not None:
            policy[key] = value
    if a.retry_client_errors:
        policy["retryClientErrors"] = True
    if a.ordered:
        policy["ordered"] = True
    body = {"name": a.name, "endpoint": a.endpoint, "deliveryType": a.delivery_type,
            "subscriptionPolicy": policy}
    call(api, "POST", _topic_path(a.topic) + "/subscriptions", body)


def delete_subscription(api: Api, a):
    call(api, "DELETE", f"{_topic_path(a.topic)}/subscriptions/{quote(a.name, safe='')}")


def set_subscription_state(api: Api, a):
    call(api, "PUT", f"{_topic_path(a.topic)}/subscriptions/{quote(a.name, safe='')}/state",
         content=json.dumps(a.state.upper()).encode())


register(Verb("list_hermes_topics", "Lists Hermes topics", list_topics,
              banner=lambda a: "Listing Hermes topics ..."))
register(Verb("add_hermes_topic", "Creates a Hermes topic (an exchange)", add_topic, [
    ("name", {"help": "group.topic"}),
    ("--content-type", {"choices": ("JSON", "AVRO"), "default": "JSON"}),
    ("--ack", {"choices": ("ALL", "LEADER"), "default": "ALL"}),
    ("--schema-file", {"default": None, "help": "Avro schema (.avsc) for AVRO topics"}),
    ("--max-message-size", {"type": int, "default": None}),
    ("--description", {"default": ""}),
    ("--owner", {"default": ""})],
    banner=lambda a: f'Adding Hermes topic "{a.name}" ...'))
register(Verb("delete_hermes_topic", "Deletes a Hermes topic without subscriptions", delete_topic,
              [("name", {})], banner=lambda a: f'Deleting Hermes topic "{a.name}" ...'))
register(Verb("set_hermes_topic_schema", "Sets a new (backward compatible) Avro schema",
              set_topic_schema, [("name", {}), ("schema_file", {})],
              banner=lambda a: f'Setting the schema of Hermes topic "{a.name}" ...'))
register(Verb("list_hermes_subscriptions", "Lists the push subscriptions of a topic",
              list_subscriptions, [("topic", {})],
              banner=lambda a: f'Listing subscriptions of Hermes topic "{a.topic}" ...'))
register(Verb("add_hermes_subscription", "Creates a push subscription", add_subscription, [
    ("topic", {}), ("name", {}), ("endpoint", {}),
    ("--delivery-type", {"choices": ("SERIAL", "BATCH"), "default": "SERIAL"}),
    ("--rate", {"type": float, "default": None}),
    ("--inflight", {"type": int, "default": None}),
    ("--ttl", {"type": int, "default": None, "help": "in-flight TTL, seconds"}),
    ("--backoff", {"type": int, "default": None, "help": "ms between retries"}),
    ("--request-timeout", {"type": int, "default": None, "help": "ms"}),
    ("--retry-client-errors", {"action": "store_true"}),
    ("--ordered", {"action": "store_true"})],
    banner=lambda a: f'Adding subscription "{a.name}" to Hermes topic "{a.topic}" ...'))
register(Verb("delete_hermes_subscription", "Deletes a push subscription and its queue",
              delete_subscription, [("topic", {}), ("name", {})],
              banner=lambda a: f'Deleting subscription "{a.name}" of Hermes topic "{a.topic}" ...'))
register(Verb("set_hermes_subscription_state", "Suspends or activates a push subscription",
              set_subscription_state, [("topic", {}), ("name", {}),
                                       ("state", {"choices": ("ACTIVE", "SUSPENDED")})],
              banner=lambda a: f'Setting subscription "{a.name}" of "{a.topic}" to {a.state} ...'))
