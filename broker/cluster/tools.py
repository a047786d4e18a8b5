"""``python -m broker cluster status | forget-node NAME``: read and repair the cluster's
records in etcd (no running broker needed; the same ``--cluster`` URL as the nodes)."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import trio

from .settings import ClusterConfigError, parse_cluster_url

if TYPE_CHECKING:
    from .etcd import EtcdGateway


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("cluster", help="cluster status / forget-node / sync-queue / "
                                              "cancel-sync-queue (through etcd)")
    p.add_argument("action", choices=("status", "forget-node", "sync-queue", "cancel-sync-queue"))
    p.add_argument("node", nargs="?", help="node name (forget-node), queue name (sync-queue, "
                                           "cancel-sync-queue)")
    p.add_argument("--vhost", default="/", help="the queue's vhost (sync-queue)")
    p.add_argument("--cluster", required=True, metavar="URL",
                   help="etcd://HOST:2379[,HOST:2379]/PREFIX, as given to the nodes")
    p.add_argument("--json", action="store_true", help="print JSON (status)")
    p.set_defaults(handler=main)


def main(args) -> int:
    # etcd's client (httpx) is imported here, not when the command line is parsed: every
    # broker start builds this parser
    from .etcd import CoordinationError, CoordinationUnavailable

    try:
        endpoints, prefix = parse_cluster_url(args.cluster)
    except ClusterConfigError as exc:
        print(f"triomq: error: {exc}", file=sys.stderr)
        return 2
    if args.action != "status" and not args.node:
        what = "a node name" if args.action == "forget-node" else "a queue name"
        print(f"triomq: error: cluster {args.action} needs {what}", file=sys.stderr)
        return 2
    try:
        return trio.run(_main, args, endpoints, prefix)
    except (CoordinationUnavailable, CoordinationError) as exc:
        print(f"triomq: error: {exc}", file=sys.stderr)
        return 1


async def _main(args, endpoints, prefix) -> int:
    from .etcd import EtcdGateway
    from .node import cluster_view

    coord = EtcdGateway(endpoints)
    try:
        if args.action == "status":
            view = await cluster_view(coord, prefix)
            print(json.dumps(view, indent=2) if args.json else render(view, prefix))
            return 0
        if args.action in ("sync-queue", "cancel-sync-queue"):
            return await _sync(coord, prefix, args.vhost, args.node, args.action)
        return await _forget(coord, prefix, args.node)
    finally:
        await coord.aclose()


def render(view: dict, prefix: str) -> str:
    lines = [f"Cluster {prefix.strip('/')} (etcd revision {view['revision']}, "
             f"{view['definitions']} definitions)", "", "Nodes:"]
    if not view["nodes"]:
        lines.append("  (none)")
    for n in view["nodes"]:
        lines.append(f"  {n['name']:<20} {n['health']:<5} {n['advertise']}")
    lines += ["", "Queues (vhost, name, master, epoch, mirrors, in sync):"]
    if not view["queues"]:
        lines.append("  (none)")
    for q in view["queues"]:
        mirrors = ",".join(q["mirrors"]) or "-"
        in_sync = ",".join(q["in_sync"]) or "-"
        sync = q.get("sync", {})
        progress = "".join(
            f" {node} syncing {sync[node]['synced']}/{sync[node]['total']}" if node in sync
            else f" {node} {state}" for node, state in q["progress"].items())
        master = q["master"] or f"(none: home {q['home']} down)"
        epoch = q["epoch"] if q["epoch"] is not None else "-"
        lines.append(f"  {q['vhost']:<8} {q['name']:<24} {master:<16} {epoch:<8} "
                     f"{mirrors:<20} {in_sync}{progress}")
    return "\n".join(lines)


async def _forget(coord: EtcdGateway, prefix: str, node: str) -> int:
    """As ``rabbitmqctl forget_cluster_node``: refused while the node runs; removes its
    membership and the master records it left behind (its queues become unmastered)."""
    live = await coord.get(f"{prefix}nodes/{node}")
    if live is not None:
        print(f"triomq: error: node {node!r} is running ({live.json().get('instance', '?')}); "
              f"stop it first", file=sys.stderr)
        return 1
    member = await coord.get(f"{prefix}members/{node}")
    if member is None:
        print(f"triomq: error: node {node!r} is not a member of cluster {prefix.strip('/')}",
              file=sys.stderr)
        return 1
    await coord.delete(f"{prefix}members/{node}")
    removed = 0
    for section in ("masters", "homes"):
        kvs, _ = await coord.get_prefix(f"{prefix}{section}/")
        for kv in kvs:
            if kv.json().get("node") == node and await coord.delete_if(kv.key, kv.mod_revision):
                removed += section == "homes"
    # the definitions of its queues (every other node holds a proxy of each) and their
    # bindings: the queues can be declared afresh elsewhere
    kvs, _ = await coord.get_prefix(f"{prefix}defs/queue/")
    gone = set()
    for kv in kvs:
        d = kv.json().get("d", {})
        if d.get("master") == node and await coord.delete_if(kv.key, kv.mod_revision):
            gone.add((d.get("vhost"), d.get("name")))
    kvs, _ = await coord.get_prefix(f"{prefix}defs/binding/")
    for kv in kvs:
        d = kv.json().get("d", {})
        if d.get("destination_kind") == "queue" and (d.get("vhost"), d.get("destination")) in gone:
            await coord.delete_if(kv.key, kv.mod_revision)
    print(f"node {node!r} removed from cluster {prefix.strip('/')} ({removed} durable queues "
          f"it was home of forgotten)")
    return 0


async def _sync(coord, prefix: str, vhost: str, queue: str, action: str) -> int:
    """Ask the queue's master (through etcd: it watches ``syncreq/``) to synchronise its
    unsynchronised mirrors now (ha-sync-mode manual), or to stop a sync."""
    import time

    from .node import queue_key
    master = await coord.get(f"{prefix}masters/{queue_key(vhost, queue)}")
    if master is None:
        print(f"triomq: error: queue {queue!r} in vhost {vhost!r} has no master now",
              file=sys.stderr)
        return 1
    what = "sync" if action == "sync-queue" else "cancel"
    await coord.put(f"{prefix}syncreq/{queue_key(vhost, queue)}",
                    json.dumps({"action": what, "at": time.time()}).encode())
    print(f"{action} of queue {queue!r} in vhost {vhost!r} sent to its master "
          f"{master.json().get('node', '?')!r}")
    return 0
