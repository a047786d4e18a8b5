"""ctl verbs for the node (channels, cluster status, version, environment), runtime
parameters and limits, and rabbitmq-queues' quorum verbs. Does not talk HTTP itself
(``core.Api``) nor parse the command line; policies are in entity_verbs."""
from __future__ import annotations

import json
from argparse import Namespace
from typing import Any

from .core import (
    EX_NOUSER,
    EX_UNAVAILABLE,
    Api,
    CtlError,
    Result,
    Rows,
    Verb,
    columns,
    need_vhost,
    q,
    register,
    vhost_missing,
)

_CHANNEL_KEYS = {"pid", "connection", "name", "number", "user", "vhost", "transactional",
                 "confirm", "consumer_count", "messages_unacknowledged", "messages_uncommitted",
                 "acks_uncommitted", "messages_unconfirmed", "prefetch_count",
                 "global_prefetch_count"}


def _node_verbs() -> None:
    def list_channels(api: Api, a: Namespace) -> Rows:
        cols = columns(a, ["pid", "user", "consumer_count", "messages_unacknowledged"],
                        _CHANNEL_KEYS)
        rows: list[dict[str, Any]] = []
        for ch in api.get("/channels"):
            # a channel's pid is its name here ("peer -> local (n)"), as in the API
            rows.append({**ch, "pid": ch["name"],
                         "connection": ch.get("connection_details", {}).get("name")})
        return cols, rows

    def cluster_status(api: Api, a: Namespace) -> str:
        overview = api.get("/overview")
        name = api.get("/cluster-name")["name"]
        nodes = api.get("/nodes")
        running = [n["name"] for n in nodes if n.get("running")]
        alarms = [f"Node {n['name']}, {alarm}" for n in nodes for alarm in n.get("alarms", [])]
        if a.formatter == "json":
            return json.dumps({"cluster_name": name, "disk_nodes": [n["name"] for n in nodes],
                               "running_nodes": running, "alarms": alarms,
                               "versions": {n["name"]: {
                                   "rabbitmq_version": overview.get("rabbitmq_version"),
                                   "product_name": overview.get("product_name"),
                                   "product_version": overview.get("product_version")}
                                   for n in nodes},
                               "listeners": overview.get("listeners", [])})
        lines = ["Basics", "", f"Cluster name: {name}", "", "Disk Nodes", "",
                 *[n["name"] for n in nodes], "", "Running Nodes", "", *running, "",
                 "Versions", "",
                 *[f"{n['name']}: {overview.get('product_name')} "
                   f"{overview.get('product_version')} (RabbitMQ "
                   f"{overview.get('rabbitmq_version')} compatible)" for n in nodes], "",
                 "Maintenance status", "",
                 *[f"Node: {n['name']}, status: "
                   f"{'under maintenance' if n.get('being_drained') else 'not under maintenance'}"
                   for n in nodes], "",
                 "Alarms", "", *(alarms or ["(none)"]), "", "Network Partitions", "",
                 *([f"{n['name']}: {p}" for n in nodes for p in n.get("partitions", [])]
                   or ["(none)"]), "", "Listeners", ""]
        for entry in overview.get("listeners", []):
            lines.append(f"Node: {entry.get('node')}, interface: {entry['ip_address']}, "
                         f"port: {entry['port']}, protocol: {entry['protocol']}")
        return "\n".join(lines)

    def version(api: Api, a: Namespace) -> str:
        from .. import __version__
        return __version__  # the CLI's own version, as rabbitmqctl's

    def await_startup(api: Api, a: Namespace) -> None:
        # ask until the broker answers: it is up once its HTTP API serves (it binds after
        # AMQP listens); unreachable until --timeout is 69, as rabbitmqctl
        import time
        deadline = time.monotonic() + a.timeout
        while True:
            try:
                api.get("/overview")
                return None
            except CtlError as exc:
                if exc.status != EX_UNAVAILABLE or time.monotonic() >= deadline:
                    raise
            time.sleep(0.2)

    def environment(api: Api, a: Namespace) -> str:
        env = api.get("/environment")
        if a.formatter == "json":
            return json.dumps(env)
        items = ",\n   ".join(f"{{{k},{json.dumps(v)}}}" for k, v in sorted(env.items()))
        return f"[{{triomq,\n  [{items}]}}]"

    register(Verb("list_channels", "Lists all channels in the node", list_channels,
                  [("columns", {"nargs": "*"})], banner=lambda a: "Listing channels ..."))
    register(Verb("cluster_status", "Displays all the nodes in the cluster grouped by node "
                  "type, together with the currently running nodes", cluster_status,
                  banner=lambda a: "Cluster status of node triomq@localhost ..."))
    register(Verb("version", "Displays CLI tools version", version))
    register(Verb("await_startup", "Waits for the node to finish booting", await_startup))
    register(Verb("environment", "Displays the name and value of each variable in the "
                  "application environment", environment,
                  banner=lambda a: "Application environment of node triomq@localhost ..."))


def _parameter_verbs() -> None:
    def list_parameters(api: Api, a: Namespace) -> Rows:
        need_vhost(api, a.vhost)
        # policies and operator policies have verbs of their own (rabbitmqctl leaves them out)
        rows = [p for p in api.get("/parameters") if p.get("vhost") == a.vhost
                and p.get("component") not in ("policy", "operator_policy")]
        return ["component", "name", "value"], rows

    def list_global_parameters(api: Api, a: Namespace) -> Rows:
        # values as JSON, as rabbitmqctl prints them ("name" quoted)
        return ["name", "value"], [{"name": p["name"], "value": json.dumps(p["value"])}
                                   for p in api.get("/global-parameters")]

    def list_vhost_limits(api: Api, a: Namespace) -> Result:
        if a.global_:
            rows = [{"vhost": r["vhost"], "limits": r["value"]}
                    for r in api.get("/vhost-limits")]
            return ["vhost", "limits"], rows
        rows = api.get(f"/vhost-limits/{q(a.vhost)}", not_found=vhost_missing(a.vhost))
        if not rows:
            return None
        return json.dumps(rows[0]["value"], separators=(",", ":"))

    def clear_vhost_limits(api: Api, a: Namespace) -> None:
        for r in api.get(f"/vhost-limits/{q(a.vhost)}", not_found=vhost_missing(a.vhost)):
            for name in r["value"]:
                api.call("DELETE", f"/vhost-limits/{q(a.vhost)}/{q(name)}")

    def list_user_limits(api: Api, a: Namespace) -> Rows | str:
        if a.global_ or a.user is None:
            rows = [{"user": r["user"], "limits": r["value"]} for r in api.get("/user-limits")]
            return ["user", "limits"], rows
        rows = api.get(f"/user-limits/{q(a.user)}",
                       not_found=(f'User "{a.user}" does not exist', EX_NOUSER))
        return json.dumps(rows[0]["value"] if rows else {}, separators=(",", ":"))

    def clear_user_limits(api: Api, a: Namespace) -> None:
        rows = api.get(f"/user-limits/{q(a.username)}",
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        names = [n for r in rows for n in r["value"]] if a.limit_name == "all" \
            else [a.limit_name]
        for name in names:
            api.call("DELETE", f"/user-limits/{q(a.username)}/{q(name)}",
                     not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    register(Verb("list_parameters", "Lists runtime parameters for a virtual host",
                  list_parameters, vhost=True,
                  banner=lambda a: f'Listing runtime parameters for vhost "{a.vhost}" ...'))
    register(Verb("list_global_parameters", "Lists global runtime parameters",
                  list_global_parameters,
                  banner=lambda a: "Listing global runtime parameters ..."))
    register(Verb("list_vhost_limits", "Displays configured virtual host limits",
                  list_vhost_limits,
                  [("--global", {"action": "store_true", "dest": "global_"})], vhost=True,
                  banner=lambda a: "Listing limits for all vhosts ..." if a.global_ else
                  f'Listing limits for vhost "{a.vhost}" ...'))
    register(Verb("clear_vhost_limits", "Clears virtual host limits", clear_vhost_limits,
                  vhost=True,
                  banner=lambda a: f'Clearing vhost "{a.vhost}" limits ...'))
    register(Verb("list_user_limits", "Displays configured user limits", list_user_limits,
                  # rabbitmqctl's ``--user U``: a positional here, --user being the login
                  [("user", {"nargs": "?", "default": None}),
                   ("--global", {"action": "store_true", "dest": "global_"})],
                  banner=lambda a: "Listing limits for all users ..."
                  if a.global_ or a.user is None else f'Listing limits for user "{a.user}" ...'))
    register(Verb("clear_user_limits", "Clears user connection/channel limits",
                  clear_user_limits, [("username", {}), ("limit_name", {})],
                  banner=lambda a: f'Clearing "{a.limit_name}" limit for user '
                                   f'"{a.username}" ...'))


def _quorum_queue(api: Api, a: Namespace) -> dict[str, Any]:
    queue: dict[str, Any] = api.get(f"/queues/{q(a.vhost)}/{q(a.queue)}",
                                    not_found=("not_found", EX_UNAVAILABLE))
    if queue.get("type") != "quorum":
        raise CtlError(f"{a.queue} is not a quorum queue", EX_UNAVAILABLE)
    return queue


def _quorum_verbs() -> None:
    """rabbitmq-queues' verbs for quorum queues, as RabbitMQ answers them on one node: the
    node is every quorum queue's only member, so it cannot be added again nor removed."""
    def quorum_status(api: Api, a: Namespace) -> Rows:
        queue = _quorum_queue(api, a)
        online = queue.get("online", queue.get("members", []))
        # in a cluster: the queue's term, its members down ("noproc", as RabbitMQ), and the
        # log as its leader has it (seqs: the leader's last and commit index, the highest
        # each follower confirmed; a follower commits what it has up to the leader's)
        logs: dict[str, int] = queue.get("log_index") or {}
        commit: int | None = queue.get("commit_index")

        def index(m: str, committed: bool = False) -> int | str:
            if m not in logs:
                return "undefined"
            return min(logs[m], commit) if committed and commit is not None else logs[m]
        rows = [{"Node Name": m, "Raft State": "leader" if m == queue.get("leader")
                 else "follower" if m in online else "noproc", "Log Index": index(m),
                 "Commit Index": index(m, True), "Snapshot Index": "undefined",
                 "Term": queue.get("term") or 1, "Machine Version": "undefined"}
                for m in queue.get("members", [])]
        return ["Node Name", "Raft State", "Log Index", "Commit Index", "Snapshot Index",
                "Term", "Machine Version"], rows

    def _members(api: Api, a: Namespace, method: str) -> None:
        # a cluster's node (its queue view has a term) takes the change to the leader
        api.call(method, f"/queues/{q(a.vhost)}/{q(a.queue)}/members/{q(a.node)}",
                 not_found=(f"Error:\n{a.node} is not a node of this cluster",
                            EX_UNAVAILABLE))

    def add_member(api: Api, a: Namespace) -> None:
        queue = _quorum_queue(api, a)
        if a.node in queue.get("members", []):
            return  # already a member: nothing to do, success as RabbitMQ
        if "term" not in queue:
            raise CtlError(f"Error:\n{a.node} is not a node of this cluster", EX_UNAVAILABLE)
        _members(api, a, "PUT")

    def delete_member(api: Api, a: Namespace) -> None:
        queue = _quorum_queue(api, a)
        members = queue.get("members", [])
        if a.node not in members:
            raise CtlError("Error:\nnot_found", EX_UNAVAILABLE)
        if len(members) == 1:
            raise CtlError("Error:\nlast_node", EX_UNAVAILABLE)
        _members(api, a, "DELETE")

    def _quorum_queues(api: Api, a: Namespace) -> list[dict[str, Any]]:
        return [x for x in api.get("/queues") if x.get("type") == "quorum"]

    def _member_path(x: dict[str, Any], node: str) -> str:
        return f"/queues/{q(x['vhost'])}/{q(x['name'])}/members/{q(node)}"

    def grow(api: Api, a: Namespace) -> str:
        # one node: every quorum queue already has it; a cluster's queues (their view has a
        # term) get it as a member, all of them or (even) those with an even group
        for x in _quorum_queues(api, a):
            members = x.get("members", [])
            if "term" in x and a.node not in members and (
                    a.strategy == "all" or len(members) % 2 == 0):
                api.call("PUT", _member_path(x, a.node),
                         not_found=(f"Error:\n{a.node} is not a node of this cluster",
                                    EX_UNAVAILABLE))
        return ""

    def shrink(api: Api, a: Namespace) -> Rows:
        rows: list[dict[str, Any]] = []
        for x in _quorum_queues(api, a):
            members = x.get("members", [])
            if a.node not in members:
                continue
            result = "error: the last node cannot be removed"
            if "term" in x and len(members) > 1:
                if a.node == x.get("leader"):
                    result = "error: the leader is not removed (move it first)"
                else:
                    api.call("DELETE", _member_path(x, a.node))
                    result = "ok"
            rows.append({"vhost": x["vhost"], "name": x["name"], "size": len(members),
                         "result": result})
        return ["vhost", "name", "size", "result"], rows

    qv: list[tuple[str, dict[str, Any]]] = [("queue", {})]
    register(Verb("quorum_status", "Displays quorum status of a quorum queue", quorum_status,
                  qv, vhost=True, banner=lambda a: f"Status of quorum queue {a.queue} on "
                                                   f"node triomq@localhost ..."))
    register(Verb("add_member", "Adds a quorum queue member (replica) on the given node",
                  add_member, [*qv, ("node", {})], vhost=True,
                  banner=lambda a: f"Adding a replica for queue {a.queue} on node "
                                   f"{a.node}..."))
    register(Verb("delete_member", "Removes a quorum queue member (replica) on the given "
                  "node", delete_member, [*qv, ("node", {})], vhost=True,
                  banner=lambda a: f"Removing a replica of queue {a.queue} on node "
                                   f"{a.node}..."))
    register(Verb("grow", "Grows quorum queue clusters by adding a member (replica) on the "
                  "specified node for all matching queues", grow,
                  [("node", {}), ("strategy", {"choices": ["all", "even"]})],
                  banner=lambda a: f"Growing {a.strategy} quorum queues on {a.node}..."))
    register(Verb("shrink", "Shrinks quorum queue clusters by removing any members "
                  "(replicas) on the given node", shrink, [("node", {})],
                  banner=lambda a: f"Shrinking quorum queues on {a.node}..."))


for _group in (_node_verbs, _parameter_verbs, _quorum_verbs):
    _group()
