"""``python -m jepsen --rounds 20 --nemesis kill9,sigstop [--topology mirrored [--netns]]``:
faults under confirmed load on a shared-store (PostgreSQL) master/standby pair, or on an
etcd-coordinated cluster with mirrored queues (``--netns``: every host in its own network
namespace, for the network nemeses); prints the verdict as JSON; exit status 1 if a
confirmed message was lost or a nacked one delivered."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from .mirrored import MIRRORED_NEMESES, NETWORK_NEMESES
from .nemesis import NEMESES
from .runner import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jepsen", description=__doc__)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--nemesis", default="kill9,sigstop",
                   help=f"comma-separated, cycled through: {', '.join(NEMESES)}; mirrored: "
                        f"{', '.join(MIRRORED_NEMESES)} (network ones need --netns)")
    p.add_argument("--nodes", type=int, default=None,
                   help="brokers sharing the store (2), or cluster nodes (mirrored: 3)")
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--queues", type=int, default=2)
    p.add_argument("--pause", type=float, default=20.0, help="SIGSTOP length, seconds")
    p.add_argument("--lease", type=float, default=3.0, help="--sql-lease of the brokers")
    p.add_argument("--renew", type=float, default=0.5, help="--sql-renew of the brokers")
    p.add_argument("--workdir", default=None, help="broker logs and data (default: a temp dir)")
    p.add_argument("--topology", choices=("shared-store", "mirrored"), default="shared-store",
                   help="shared-store: brokers on one PostgreSQL store (--sql-standby); "
                        "mirrored: etcd and --nodes nodes with a ha-mode all policy")
    p.add_argument("--ttl", type=float, default=2.0, help="--cluster-ttl (mirrored)")
    p.add_argument("--queue-type", choices=("classic", "quorum"), default="classic",
                   help="mirrored topology: classic queues under ha-mode all, or quorum queues "
                        "(replicated on 3 members, majority confirms)")
    p.add_argument("--client", choices=("pika", "kombu", "aio-pika"), default="pika",
                   help="mirrored: the workload's client library (producers and consumers)")
    p.add_argument("--netns", action="store_true",
                   help="mirrored: etcd and each node in a network namespace on a bridge "
                        "(root, iproute2); needed by the network nemeses")
    p.add_argument("--prefix", default="jm",
                   help="netns: name prefix of namespaces and links (1-4 letters); leftovers "
                        "of a crashed run with the same prefix are removed")
    args = p.parse_args(argv)
    nemeses = tuple(n.strip() for n in args.nemesis.split(",") if n.strip())
    known = MIRRORED_NEMESES if args.topology == "mirrored" else tuple(NEMESES)
    unknown = [n for n in nemeses if n not in known]
    if unknown or not nemeses:
        p.error(f"unknown nemesis {', '.join(unknown) or '(none)'}; known: {', '.join(known)}")
    if any(n in NETWORK_NEMESES for n in nemeses) and not args.netns:
        p.error(f"{', '.join(NETWORK_NEMESES)} need --netns")
    if args.netns:
        from .netns import unavailable
        why = unavailable()
        if why:
            p.error(f"--netns: {why}")
    if args.nodes is None:
        args.nodes = 3 if args.topology == "mirrored" else 2
    if args.rounds < 1 or args.nodes < 2:
        p.error("--rounds must be >= 1 and --nodes >= 2")
    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # SIGTERM stops the brokers too, as Ctrl-C
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # every reconnect is expected here
    if args.topology == "mirrored":
        from .mirrored import run_mirrored
        result = run_mirrored(rounds=args.rounds, nemeses=nemeses, nodes=args.nodes,
                              producers=args.producers, consumers=args.consumers,
                              queues=args.queues, pause=args.pause, ttl=args.ttl,
                              workdir=args.workdir, netns=args.netns, prefix=args.prefix,
                              queue_type=args.queue_type, client=args.client)
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] else 1
    result = run(rounds=args.rounds, nemeses=nemeses, nodes=args.nodes,
                 producers=args.producers, consumers=args.consumers, queues=args.queues,
                 pause=args.pause, lease=args.lease, renew=args.renew, workdir=args.workdir)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
