"""ctl verbs for policies, operator policies, queues, exchanges, bindings, connections,
consumers and definitions. Does not talk HTTP itself (``core.Api``) nor parse the command
line."""
from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

from .core import (
    EX_DATAERR,
    Api,
    CtlError,
    Rows,
    Verb,
    columns,
    json_arg,
    q,
    register,
    vhost_missing,
)


def _policy_calls(path: str) -> tuple[Callable[[Api, Namespace], None],
                                    Callable[[Api, Namespace], None],
                                    Callable[[Api, Namespace], Rows]]:
    """set, clear and list over /policies or /operator-policies: the same calls and refusals."""
    def set_(api: Api, a: Namespace) -> None:
        definition = json_arg(a.definition, "definition")
        api.call("PUT", f"/{path}/{q(a.vhost)}/{q(a.name)}",
                 {"pattern": a.pattern, "definition": definition, "priority": a.priority,
                  "apply-to": a.apply_to}, not_found=vhost_missing(a.vhost))

    def clear(api: Api, a: Namespace) -> None:
        api.call("DELETE", f"/{path}/{q(a.vhost)}/{q(a.name)}",
                 not_found=("Parameter does not exist", EX_DATAERR))

    def list_(api: Api, a: Namespace) -> Rows:
        rows = api.get(f"/{path}/{q(a.vhost)}", not_found=vhost_missing(a.vhost))
        return ["vhost", "name", "pattern", "apply-to", "definition", "priority"], rows
    return set_, clear, list_


def _policy_verbs() -> None:
    set_policy, clear_policy, list_policies = _policy_calls("policies")
    register(Verb("set_policy", "Sets or updates a policy", set_policy, [
        ("name", {}), ("pattern", {}), ("definition", {}),
        ("--priority", {"type": int, "default": 0}),
        ("--apply-to", {"default": "all", "choices": ["queues", "classic_queues",
                                                    "quorum_queues", "streams", "exchanges",
                                                    "all"]})],
        vhost=True, banner=lambda a: f'Setting policy "{a.name}" for pattern "{a.pattern}" '
                                     f'to "{a.definition}" with priority "{a.priority}" for '
                                     f'vhost "{a.vhost}" ...'))
    register(Verb("clear_policy", "Clears (removes) a policy", clear_policy, [("name", {})],
                  vhost=True,
                  banner=lambda a: f'Clearing policy "{a.name}" on vhost "{a.vhost}" ...'))
    register(Verb("list_policies", "Lists all policies in a virtual host", list_policies,
                  vhost=True, banner=lambda a: f'Listing policies for vhost "{a.vhost}" ...'))

    set_operator_policy, clear_operator_policy, list_operator_policies = \
        _policy_calls("operator-policies")
    register(Verb("set_operator_policy", "Sets an operator policy that overrides a subset of "
                  "arguments in user policies", set_operator_policy, [
                      ("name", {}), ("pattern", {}), ("definition", {}),
                      ("--priority", {"type": int, "default": 0}),
                      ("--apply-to", {"default": "queues",
                                      "choices": ["queues", "classic_queues", "quorum_queues",
                                                  "streams"]})],
                  vhost=True,
                  banner=lambda a: f'Setting operator policy override "{a.name}" for pattern '
                                   f'"{a.pattern}" to "{a.definition}" with priority '
                                   f'"{a.priority}" for vhost "{a.vhost}" ...'))
    register(Verb("clear_operator_policy", "Clears an operator policy",
                  clear_operator_policy, [("name", {})], vhost=True,
                  banner=lambda a: f'Clearing operator policy "{a.name}" on vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("list_operator_policies", "Lists operator policy overrides for a virtual "
                  "host", list_operator_policies, vhost=True,
                  banner=lambda a: f'Listing operator policy overrides for vhost "{a.vhost}" '
                                   f'...'))


_QUEUE_KEYS = {"name", "durable", "auto_delete", "arguments", "policy", "operator_policy",
               "effective_policy_definition", "exclusive", "messages", "messages_ready",
               "messages_unacknowledged", "message_bytes", "message_bytes_ready", "consumers",
               "memory", "state", "type", "vhost", "consumer_utilisation",
               "exclusive_consumer_tag", "single_active_consumer_tag", "head_message_timestamp",
               # in a cluster, as the queue's master has them (the same from every node)
               "node", "leader", "members", "online", "slave_nodes",
               "synchronised_slave_nodes", "term"}
_EXCHANGE_KEYS = {"name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                  "vhost"}
_BINDING_KEYS = {"source_name", "source_kind", "destination_name", "destination_kind",
                 "routing_key", "arguments", "vhost"}
_CONNECTION_KEYS = {"name", "user", "vhost", "peer_host", "peer_port", "host", "port", "state",
                    "channels", "protocol", "auth_mechanism", "ssl", "timeout", "frame_max",
                    "channel_max", "client_properties", "connected_at", "type", "send_pend"}
_CONSUMER_KEYS = {"queue_name", "channel_pid", "consumer_tag", "ack_required",
                  "prefetch_count", "active", "activity_status", "arguments", "exclusive"}


def _entity_verbs() -> None:
    def list_queues(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["name", "messages"], _QUEUE_KEYS)
        return cols, api.get(f"/queues/{q(a.vhost)}", not_found=vhost_missing(a.vhost))

    def list_exchanges(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["name", "type"], _EXCHANGE_KEYS)
        return cols, api.get(f"/exchanges/{q(a.vhost)}", not_found=vhost_missing(a.vhost))

    def list_bindings(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["source_name", "source_kind", "destination_name",
                            "destination_kind", "routing_key", "arguments"], _BINDING_KEYS)
        rows = [{"source_name": b["source"], "source_kind": "exchange",
                 "destination_name": b["destination"], "destination_kind": b["destination_type"],
                 "routing_key": b["routing_key"], "arguments": b["arguments"],
                 "vhost": b["vhost"]}
                for b in api.get(f"/bindings/{q(a.vhost)}", not_found=vhost_missing(a.vhost))]
        return cols, rows

    def list_connections(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["user", "peer_host", "peer_port", "state"], _CONNECTION_KEYS)
        return cols, api.get("/connections")

    def list_consumers(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                            "prefetch_count", "active", "arguments"], _CONSUMER_KEYS)
        rows = [{"queue_name": c["queue"]["name"], "channel_pid": c["channel_details"]["name"],
                 "consumer_tag": c["consumer_tag"], "ack_required": c["ack_required"],
                 "prefetch_count": c["prefetch_count"], "active": c["active"],
                 "activity_status": c.get("activity_status"), "arguments": c["arguments"],
                 "exclusive": c["exclusive"]}
                for c in api.get(f"/consumers/{q(a.vhost)}", not_found=vhost_missing(a.vhost))]
        return cols, rows

    def close_connection(api: Api, a: Namespace) -> None:
        api.client.headers["X-Reason"] = a.explanation
        api.call("DELETE", "/connections/" + q(a.connection_name),
                 not_found=(f"connection {a.connection_name} not found", EX_DATAERR))

    def purge_queue(api: Api, a: Namespace) -> None:
        api.call("DELETE", f"/queues/{q(a.vhost)}/{q(a.queue)}/contents",
                 not_found=(f"queue '{a.queue}' in vhost '{a.vhost}' not found", EX_DATAERR))

    def delete_queue(api: Api, a: Namespace) -> str:
        params = []
        if a.if_empty:
            params.append("if-empty=true")
        if a.if_unused:
            params.append("if-unused=true")
        suffix = "?" + "&".join(params) if params else ""
        queue = api.get(f"/queues/{q(a.vhost)}/{q(a.queue)}",
                        not_found=(f"queue '{a.queue}' in vhost '{a.vhost}' not found",
                                   EX_DATAERR))
        api.call("DELETE", f"/queues/{q(a.vhost)}/{q(a.queue)}{suffix}")
        return f"Queue was successfully deleted with {queue.get('messages', 0)} messages"

    cols = ("columns", {"nargs": "*"})
    register(Verb("list_queues", "Lists queues and their properties", list_queues, [cols],
                  vhost=True, banner=lambda a: f"Listing queues for vhost {a.vhost} ..."))
    register(Verb("list_exchanges", "Lists exchanges", list_exchanges, [cols], vhost=True,
                  banner=lambda a: f"Listing exchanges for vhost {a.vhost} ..."))
    register(Verb("list_bindings", "Lists all bindings on a vhost", list_bindings, [cols],
                  vhost=True, banner=lambda a: f"Listing bindings for vhost {a.vhost}..."))
    register(Verb("list_connections", "Lists AMQP 0.9.1 connections for the node",
                  list_connections, [cols], banner=lambda a: "Listing connections ..."))
    register(Verb("list_consumers", "Lists all consumers for a vhost", list_consumers, [cols],
                  vhost=True, banner=lambda a: f"Listing consumers in vhost {a.vhost} ..."))
    register(Verb("close_connection", "Instructs the broker to close the connection "
                  "associated with the Erlang process id", close_connection,
                  [("connection_name", {}), ("explanation", {})],
                  banner=lambda a: f'Closing connection "{a.connection_name}", reason: '
                                   f'{a.explanation}...'))
    register(Verb("purge_queue", "Purges a queue (removes all messages in it)", purge_queue,
                  [("queue", {})], vhost=True,
                  banner=lambda a: f"Purging queue '{a.queue}' in vhost '{a.vhost}' ..."))
    register(Verb("delete_queue", "Deletes a queue", delete_queue, [
        ("queue", {}), ("--if-empty", {"action": "store_true"}),
        ("--if-unused", {"action": "store_true"})], vhost=True,
        banner=lambda a: f"Deleting queue '{a.queue}' on vhost '{a.vhost}' ..."))


def _definitions_verbs() -> None:
    def export_definitions(api: Api, a: Namespace) -> str | None:
        defs = api.get("/definitions")
        text = json.dumps(defs, indent=2)
        if a.path == "-":
            return text
        try:
            with open(a.path, "w") as f:
                f.write(text)
        except OSError as exc:
            raise CtlError(f"could not write {a.path}: {exc.strerror}", EX_DATAERR) from None
        return None

    def import_definitions(api: Api, a: Namespace) -> None:
        try:
            raw = sys.stdin.read() if a.path == "-" else Path(a.path).read_text()
        except OSError as exc:
            raise CtlError(f"could not read {a.path}: {exc.strerror}", EX_DATAERR) from None
        try:
            defs = json.loads(raw)
        except ValueError:
            raise CtlError(f"{a.path}: not valid JSON", EX_DATAERR) from None
        api.call("POST", "/definitions", defs)

    def status(api: Api, a: Namespace) -> str:
        overview = api.get("/overview")
        node = api.get("/nodes")[0]
        totals = overview.get("object_totals", {})
        if a.formatter == "json":
            return json.dumps({"pid": node.get("os_pid"), "product_name":
                               overview.get("product_name"), "product_version":
                               overview.get("product_version"), "uptime": node.get("uptime"),
                               "alarms": node.get("alarms", []), "listeners":
                               overview.get("listeners", []), "totals": totals,
                               "memory": {"used": node.get("mem_used"),
                                          "limit": node.get("mem_limit")}})
        lines = ["Runtime", "", f"OS PID: {node.get('os_pid')}",
                 f"Product name: {overview.get('product_name')}",
                 f"Product version: {overview.get('product_version')}",
                 f"Uptime (seconds): {int(node.get('uptime', 0)) // 1000}", "", "Alarms", "",
                 "\n".join(node.get("alarms") or []) or "(none)", "", "Memory", "",
                 f"Total memory used: {node.get('mem_used', 0) / 1e9:.4f} gb",
                 f"Memory high watermark: {node.get('mem_limit', 0) / 1e9:.4f} gb", "",
                 "Listeners", ""]
        for entry in overview.get("listeners", []):
            lines.append(f"Interface: {entry['ip_address']}, port: {entry['port']}, "
                         f"protocol: {entry['protocol']}")
        lines += ["", "Totals", ""] + [f"{k}: {v}" for k, v in sorted(totals.items())]
        return "\n".join(lines)

    register(Verb("export_definitions", "Exports definitions in JSON", export_definitions,
                  [("path", {})],
                  # to stdout: JSON only, as rabbitmqctl (``| jq`` must parse it)
                  banner=lambda a: None if a.path == "-" else
                  f'Exporting definitions in JSON to a file at "{a.path}" ...'))
    register(Verb("import_definitions", "Imports definitions in JSON", import_definitions,
                  [("path", {})], banner=lambda a: f'Importing definitions in JSON from a '
                                                   f'file at "{a.path}" ...'))
    register(Verb("status", "Displays status of a node", status,
                  banner=lambda a: "Status of node triomq@localhost ..."))


for _group in (_policy_verbs, _entity_verbs, _definitions_verbs):
    _group()
