"""``python -m bench.workers_placement``: what ``broker run --workers 2`` costs per message
when a queue's clients are on the process that owns it and when they are on the other one
(every publish and every delivery then crosses the node-to-node link), with RabbitMQ's
figure in the same run. Each worker's private AMQP port places the clients exactly:

* local:     queue, publisher and consumer on w1;
* forwarded: queue on w1 (min-masters, w2 already owns a queue), publisher and consumer
             connected to w2.

Broker CPU is summed over the supervisor's whole process tree (both workers, etcd)."""
from __future__ import annotations

import argparse
import base64
import json
import os
import time
import urllib.request

import pika

from . import procinfo
from .runner import DEFAULTS, run_workload


def _private_ports(pid: int) -> dict[str, int]:
    ports = {}
    for child in procinfo.process_tree(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:
            continue
        if "--private-port" in argv:
            ports[argv[argv.index("--node-name") + 1]] = int(argv[argv.index("--private-port") + 1])
    return ports


def _policy(http: int) -> None:
    auth = base64.b64encode(b"guest:guest").decode()
    body = json.dumps({"pattern": "^bench-", "apply-to": "queues",
                       "definition": {"queue-master-locator": "min-masters"}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{http}/api/policies/%2F/place",
                                     data=body, method="PUT",
                                     headers={"Authorization": f"Basic {auth}",
                                              "content-type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workers_placement", description=__doc__)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--confirms", action="store_true", help="confirms + manual acks")
    p.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/")
    a = p.parse_args(argv)
    cfg = {**DEFAULTS, "size": 64, "queue_durable": True, "duration": a.duration}
    if a.confirms:
        cfg.update(confirms=True, manual_ack=True)
    http = procinfo.free_port()
    rows = []
    with procinfo.TrioMQProcess(extra_args=["--workers", "2", "--http-port", str(http)],
                                startup_timeout=90) as b:
        deadline = time.monotonic() + 60
        while len(ports := _private_ports(b.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        for case, node in (("local", "w1"), ("forwarded", "w2")):
            url = f"amqp://guest:guest@127.0.0.1:{ports[node]}/"
            if case == "forwarded":  # w2 owns more queues: min-masters puts the next on w1
                c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ports["w2"]))
                for name in ("ballast-1", "ballast-2"):
                    c.channel().queue_declare(name, durable=True)
                c.close()
                _policy(http)
            rows.append((case, run_workload(url, cfg, broker_pid=b.pid, label=case, quiet=True)))
    rows.append(("RabbitMQ", run_workload(a.rabbit_url, cfg,
                                          broker_pid=procinfo.pid_listening_on(5672),
                                          label="RabbitMQ", quiet=True)))
    print(f"load average before/after: {os.getloadavg()}")
    print("| case | consume msg/s | broker CPU % | broker CPU µs/msg |")
    print("|---|---|---|---|")
    for case, r in rows:
        rate, cpu = r.get("consume_rate") or 0, r.get("broker_cpu_pct")
        us = cpu / 100 / rate * 1e6 if rate and cpu else float("nan")
        print(f"| {case} | {rate:,.0f} | {cpu} | {us:.1f} | {r.get('errors') or ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
