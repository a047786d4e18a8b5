"""Cost of the authorization checks on the publish path (docs/security.md).

    python -m bench.authz                      # TrioMQ and RabbitMQ, 10 s per run
    python -m bench.authz --targets triomq --duration 5 --repeat 2
    python -m bench.authz --in-process       # the publish path alone, no sockets

Workload: the bench's ordinary run (``runner.run_workload``), transient messages, publisher
confirms and manual acks, 1 producer / 1 consumer, 64 B, direct exchange, unlimited rate.
On one broker process, runs alternate between ``guest`` (permissions ``.*``) and
``bench-authz``, a user whose configure/write/read permissions are anchored alternations
that only match the bench's own names. TrioMQ is started here with the user in a
``--load-definitions`` file; on RabbitMQ the user is created through its management API
(15672) and deleted afterwards. The ratio user/guest is the cost of the checks (>= 0.95:
within the target). With ``--repeat`` the order alternates and the ratio is of the means.

``--in-process`` (imports ``broker``, unlike the rest of the bench) feeds the same batch of
50,000 pre-encoded publishes (confirm mode, direct exchange, one queue) to a broker ``Session``
15 times per case in shuffled order, with no checks (the channel's ``authz`` removed), as guest
and as ``bench-authz``, and prints the median rates: the publish path's own cost of the checks,
without the network and the client processes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from base64 import b64encode

from . import procinfo
from .runner import run_workload

USER, PASSWORD = "bench-authz", "bench-authz-pw"
NAMES = "bench-[0-9]+-[0-9]+-(q[0-9]+|direct|topic|fanout)"
PERMISSIONS = {"configure": f"^({NAMES}|amq\\.gen-.*)$", "write": f"^({NAMES}|amq\\.default)$",
               "read": f"^{NAMES}$"}
WORKLOAD = dict(confirms=True, manual_ack=True, size=64, producers=1, consumers=1)


def _rabbit_api(method: str, path: str, body: dict | None = None) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:15672/api{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Basic " + b64encode(b"guest:guest").decode()})
    urllib.request.urlopen(req, timeout=30).read()


def _pair(port: int, workload: dict, pid, repeat: int) -> dict:
    out: dict = {"guest": [], USER: []}
    for i in range(repeat):
        order = [("guest", "guest"), (USER, PASSWORD)]
        for who, pw in order if i % 2 == 0 else order[::-1]:  # alternate who runs first
            r = run_workload(f"amqp://{who}:{pw}@127.0.0.1:{port}/", workload, broker_pid=pid,
                             label=who, quiet=True)
            if r.get("errors"):
                raise SystemExit(f"{who}: {r['errors']}")
            out[who].append(r["confirm_rate"])
            time.sleep(0.5)
    return out


def in_process(rounds: int = 15, n: int = 50_000) -> None:
    import random
    import statistics

    from broker.amqp import spec
    from broker.broker import Broker
    from tests.support import SessionClient, publish_frames
    broker = Broker()
    access = broker.access
    access.put_user(USER, password=PASSWORD)
    access.set_permissions(USER, "/", **PERMISSIONS)
    setup = SessionClient(broker)
    setup.open_channel(1)
    x, q = "bench-1-2-direct", "bench-1-2-q0"
    setup.ok(1, spec.Exchange.Declare(0, x, "direct"))
    setup.declare_queue(1, q)
    setup.ok(1, spec.Queue.Bind(0, q, x, "k"))
    batch = b"".join(publish_frames(1, b"x" * 64, x, "k") for _ in range(1000))
    queue = broker.vhosts["/"].queues[q]
    times: dict = {"no checks": [], "guest": [], USER: []}
    for _ in range(rounds):
        for who in random.sample(list(times), len(times)):
            c = SessionClient(broker)
            c.open_channel(1)
            c.ok(1, spec.Confirm.Select(False))
            c.session.channels[1].authz = None if who == "no checks" else access.authz(who, "/")
            t = time.perf_counter()
            for _ in range(n // 1000):
                c.session.data_received(batch)
                c.session.conn.data_to_send()
            times[who].append(time.perf_counter() - t)
            queue.purge()
            c.drop()
    base = statistics.median(times["no checks"])
    print("\n| case | median publishes/s (in process) | time vs no checks |")
    print("|---|---|---|")
    for who, v in times.items():
        m = statistics.median(v)
        print(f"| {who} | {n / m:,.0f} | {(m / base - 1) * 100:+.1f} % |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.authz", description=__doc__.split("\n")[0])
    p.add_argument("--targets", default="triomq,rabbitmq")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--in-process", action="store_true")
    a = p.parse_args(argv)
    if a.in_process:
        in_process()
        return 0
    workload = dict(WORKLOAD, duration=a.duration)
    print(f"[bench] command: {sys.executable} -m bench.authz {' '.join(argv or sys.argv[1:])}")
    results = {}
    if "triomq" in a.targets:
        tmp = tempfile.mkdtemp(prefix="bench-authz-")
        defs = os.path.join(tmp, "defs.json")
        with open(defs, "w") as f:
            json.dump({"users": [{"name": USER, "password": PASSWORD, "tags": ""}],
                       "permissions": [{"user": USER, "vhost": "/", **PERMISSIONS}]}, f)
        b = procinfo.TrioMQProcess(extra_args=["--http-port", "0", "--load-definitions", defs])
        b.start()
        try:
            results["TrioMQ"] = _pair(b.port, workload, b.pid, a.repeat)
        finally:
            b.stop()
    if "rabbitmq" in a.targets:
        _rabbit_api("PUT", f"/users/{USER}", {"password": PASSWORD, "tags": ""})
        try:
            _rabbit_api("PUT", f"/permissions/%2F/{USER}", PERMISSIONS)
            results["RabbitMQ"] = _pair(5672, workload, procinfo.pid_listening_on(5672), a.repeat)
        finally:
            _rabbit_api("DELETE", f"/users/{USER}")
    print("\n| broker | guest (.*) confirmed msg/s | bench-authz confirmed msg/s | ratio |")
    print("|---|---|---|---|")
    for name, r in results.items():
        g, u = sum(r["guest"]) / len(r["guest"]), sum(r[USER]) / len(r[USER])
        print(f"| {name} | {' / '.join(f'{x:,.0f}' for x in r['guest'])} | "
              f"{' / '.join(f'{x:,.0f}' for x in r[USER])} | {u / g:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
