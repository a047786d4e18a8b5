"""``python -m broker.cluster.local``: a private etcd and N TrioMQ nodes on this machine, for
trying the cluster (``make cluster``). Each node has its own AMQP port and management port
(``--http-port``, default the AMQP port + 10000, as RabbitMQ's 5672/15672), printed with the
``ctl`` line that reaches it. Everything lives under ``--dir`` and stops on Ctrl-C."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.cluster.local", description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--port", type=int, default=5672, help="AMQP port of the first node; the "
                                                          "others use the next ones")
    p.add_argument("--http-port", type=int, default=None,
                   help="management HTTP port of the first node; the others use the next ones "
                        "(default: --port + 10000)")
    p.add_argument("--dir", default="./cluster-data", help="etcd and node data (kept)")
    p.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    args = p.parse_args(argv)
    if not os.path.exists(args.etcd):
        print(f"triomq: error: etcd not found at {args.etcd} (make system-deps installs it)",
              file=sys.stderr)
        return 1
    http = args.port + 10000 if args.http_port is None else args.http_port
    busy = [args.port + i for i in range(args.nodes) if _listening(args.port + i)]
    if busy:
        print(f"triomq: error: port {busy[0]} is in use (pick another with --port)", file=sys.stderr)
        return 1
    # a management port in use would leave a node without one, and ``ctl`` on that port
    # would configure whatever listens there (a RabbitMQ on 15672)
    busy = [http + i for i in range(args.nodes) if _listening(http + i)]
    if busy:
        print(f"triomq: error: management port {busy[0]} is in use (pick another with "
              f"--http-port)", file=sys.stderr)
        return 1
    os.makedirs(args.dir, exist_ok=True)
    secret = os.path.join(args.dir, "secret")
    if not os.path.exists(secret):
        with open(secret, "w") as f:
            f.write(os.urandom(24).hex())
        os.chmod(secret, 0o600)
    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # stop everything on SIGTERM as on Ctrl-C
    client, peer = _free_port(), _free_port()
    procs: list[subprocess.Popen] = []
    try:
        with open(os.path.join(args.dir, "etcd.log"), "ab") as log:
            procs.append(subprocess.Popen(
                [args.etcd, "--name", "local", "--data-dir", os.path.join(args.dir, "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"local=http://127.0.0.1:{peer}", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    print("triomq: error: etcd did not start (see etcd.log)", file=sys.stderr)
                    return 1
                time.sleep(0.1)
        url = f"etcd://127.0.0.1:{client}/local"
        for i in range(args.nodes):
            port = args.port + i
            name = f"node{i + 1}"
            with open(os.path.join(args.dir, f"{name}.log"), "ab") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
                     str(port), "--data-dir", os.path.join(args.dir, name), "--http-port",
                     str(http + i),
                     "--cluster", url, "--node-name", name, "--cluster-secret-file", secret],
                    stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while not all(_listening(args.port + i) and _listening(http + i)
                      for i in range(args.nodes)):
            if time.monotonic() > deadline or any(pr.poll() is not None for pr in procs):
                print(f"triomq: error: a node did not start (logs in {args.dir})", file=sys.stderr)
                return 1
            time.sleep(0.2)
        for i in range(args.nodes):
            print(f"node{i + 1}: amqp://guest:guest@127.0.0.1:{args.port + i}/   management "
                  f"http://127.0.0.1:{http + i}/")
        print(f"cluster: {url}   (python -m broker cluster status --cluster {url})")
        print(f"ctl:     python -m broker ctl --url http://127.0.0.1:{http} ...   (or export "
              f"TRIOMQ_URL=http://127.0.0.1:{http}; ctl's default is 127.0.0.1:15672)")
        print(f"mirror:  python -m broker ctl --url http://127.0.0.1:{http} set_policy ha "
              "'^ha\\.' '{\"ha-mode\":\"all\"}' --apply-to queues")
        subprocess.run([sys.executable, "-m", "broker", "cluster", "status", "--cluster", url])
        print("Ctrl-C stops etcd and every node")
        while all(pr.poll() is None for pr in procs):
            time.sleep(0.5)
        print("a process exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for pr in reversed(procs):  # nodes first (they revoke their leases), etcd last
            if pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
                try:
                    pr.wait(15)
                except subprocess.TimeoutExpired:
                    pr.kill()


if __name__ == "__main__":
    sys.exit(main())
