"""Probes of the mirrored-queue defects found by a new user (docs/performance-cluster.md,
"Mirrored-queue defects"): run from a checkout, it drives that checkout's broker.

    python -m bench.cluster_defects [--probe ack-multiple,placement,failover,no-link]

* ``ack-multiple``: 2 nodes, ha-mode all; 40,001 messages, 30,001 of them delivered and
  acknowledged with one basic.ack(multiple=true), then a purge of 30,001: link drops, time
  the mirror was out of the in-sync set, messages resynced.
* ``placement``: 3 nodes, ha-mode exactly 2, 30,000 messages; the mirror b stops, c takes its
  place and syncs; b comes back: time the in-sync set was empty, messages resynced.
* ``failover``: 3 nodes, ha-mode all, a pika publisher with confirms (one at a time) on each
  non-master node; kill -9 of the master: the longest wait for an answer and how publishes
  were answered.
* ``no-link``: 2 nodes, a queue on a, a killed; a publisher on b, which never linked to a:
  how long its first publish waits for an answer (cut at 30 s).
* ``catch-up``: 2 nodes, ha-mode all, 20,001 messages of 1 KiB; the mirror b is killed,
  1,000 consumed and 501 published meanwhile, b restarted: messages sent to it and the time
  from its start to its return to the in-sync set.

Each probe starts its own etcd and nodes on free ports (data under a temporary directory)
and stops them. Figures are printed as one JSON line per probe.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "interop-tests")]

import pika  # noqa: E402
from brokerproc import BrokerProc  # noqa: E402

from tests.cluster.etcdproc import EtcdProc  # noqa: E402


def _node(base: Path, etcd: EtcdProc, name: str, secret: Path, ttl: str = "2") -> BrokerProc:
    # the failover probes use a 2 s lease; the big-queue ones the default 5 s (a loop busy
    # with 40,000 messages on a loaded 2-core machine must not fence the node)
    return BrokerProc(base / name, extra=["--cluster", etcd.url("c"), "--node-name", name,
                                          "--cluster-ttl", ttl, "--cluster-secret-file",
                                          str(secret)], http=True)


def _isr(etcd: EtcdProc, queue: str) -> dict:
    import base64

    import httpx
    key = f"/c/isr/%2F/{queue}"
    r = httpx.post(f"http://{etcd.endpoint}/v3/kv/range",
                   json={"key": base64.b64encode(key.encode()).decode()})
    kvs = r.json().get("kvs", [])
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else {}


def _policy(broker: BrokerProc, definition: dict) -> None:
    import httpx
    r = httpx.put(f"{broker.http_url}/api/policies/%2F/p", auth=("guest", "guest"), json={
        "pattern": "^q$", "definition": definition, "apply-to": "queues"})
    r.raise_for_status()


def _wait(check, timeout: float, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"probe: {what} not reached in {timeout:.0f} s")
        time.sleep(0.05)


def _publish(broker: BrokerProc, n: int) -> None:
    conn = broker.connect()
    ch = conn.channel()
    for i in range(n):
        ch.basic_publish("", "q", b"m%d" % i)
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"fence")
    conn.close()


class _Watch(threading.Thread):
    """Polls the in-sync record: how long ``mirror`` was out of it, the largest sync seen."""

    def __init__(self, etcd: EtcdProc, mirror: str):
        super().__init__(daemon=True)
        self.etcd, self.mirror = etcd, mirror
        self.stop = threading.Event()
        self.out_s = 0.0
        self.synced_max = 0

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            record = _isr(self.etcd, "q")
            now = time.monotonic()
            if self.mirror not in record.get("in_sync", []):
                self.out_s += now - last
            for sync in (record.get("sync") or {}).values():
                self.synced_max = max(self.synced_max, int(sync.get("total", 0)))
            last = now
            time.sleep(0.02)


def probe_ack_multiple(base: Path, etcd: EtcdProc, secret: Path) -> dict:
    a, b = (_node(base, etcd, n, secret, "5").start() for n in ("a", "b"))
    try:
        _policy(a, {"ha-mode": "all"})
        conn = a.connect()
        conn.channel().queue_declare("q", durable=True)
        conn.close()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b"], 30)
        watch = _Watch(etcd, "b")
        watch.start()
        _publish(a, 40000)
        conn = a.connect()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=30001)
        tags = []
        for method, _, _ in ch.consume("q", inactivity_timeout=30):
            tags.append(method.delivery_tag)
            if len(tags) == 30001:
                break
        ch.basic_ack(tags[-1], multiple=True)
        conn.close()
        time.sleep(1.0)
        _publish(a, 30000)  # with the 10,000 left: 40,001 ready, then purged
        conn = a.connect()
        ch = conn.channel()
        while ch.queue_declare("q", passive=True).method.message_count < 30001:
            time.sleep(0.05)
        purged = ch.queue_purge("q").method.message_count
        conn.close()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b"], 60)
        time.sleep(1.0)
        watch.stop.set()
        watch.join()
        log = a.log()
        return {"probe": "ack-multiple", "purged": purged,
                "link_drops": log.count("fell out of sync"),
                "frame_errors": log.count("FRAME_ERROR"),
                "out_of_sync_s": round(watch.out_s, 2), "resync_messages_max": watch.synced_max}
    finally:
        b.stop()
        a.stop()


def probe_placement(base: Path, etcd: EtcdProc, secret: Path) -> dict:
    nodes = [_node(base, etcd, n, secret, "5") for n in ("a", "b", "c")]
    for n in nodes:
        n.start()
    a, b, c = nodes
    try:
        _policy(a, {"ha-mode": "exactly", "ha-params": 2})
        conn = a.connect()
        conn.channel().queue_declare("q", durable=True)
        conn.close()
        _publish(a, 30000)
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b"], 60)
        b.stop()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["c"], 60)
        empty = 0.0
        synced = 0
        b.start()
        t0 = last = time.monotonic()
        while time.monotonic() - t0 < 8:
            record = _isr(etcd, "q")
            now = time.monotonic()
            if not record.get("in_sync"):
                empty += now - last
            for sync in (record.get("sync") or {}).values():
                synced = max(synced, int(sync.get("total", 0)))
            last = now
            time.sleep(0.02)
        record = _isr(etcd, "q")
        return {"probe": "placement", "in_sync_empty_s": round(empty, 2),
                "resync_messages_max": synced, "mirrors_after": record.get("mirrors"),
                "in_sync_after": record.get("in_sync")}
    finally:
        for n in nodes:
            n.stop()


def _publisher(broker: BrokerProc, stop: threading.Event, out: list, waiting: list) -> None:
    while not stop.is_set():
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", broker.port, heartbeat=10))
            ch = conn.channel()
            ch.confirm_delivery()
            while not stop.is_set():
                t = waiting[0] = time.monotonic()
                how = "confirm"
                try:
                    ch.basic_publish("", "q", b"x", pika.BasicProperties(delivery_mode=2))
                except pika.exceptions.NackError:
                    how = "nack"
                except pika.exceptions.AMQPError as exc:
                    out.append((time.monotonic() - t, f"closed {getattr(exc, 'reply_code', '')}"))
                    waiting[0] = 0.0
                    break
                out.append((time.monotonic() - t, how))
                waiting[0] = 0.0
        except pika.exceptions.AMQPError:
            time.sleep(0.2)


def probe_failover(base: Path, etcd: EtcdProc, secret: Path) -> dict:
    nodes = [_node(base, etcd, n, secret) for n in ("a", "b", "c")]
    for n in nodes:
        n.start()
    a, b, c = nodes
    try:
        _policy(a, {"ha-mode": "all"})
        conn = a.connect()
        conn.channel().queue_declare("q", durable=True)
        conn.close()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b", "c"], 30)
        stop = threading.Event()
        runs = [([], [0.0]) for _ in (b, c)]
        threads = [threading.Thread(target=_publisher, args=(n, stop, out, w), daemon=True)
                   for n, (out, w) in zip((b, c), runs, strict=True)]
        for t in threads:
            t.start()
        time.sleep(3)
        a.kill()
        time.sleep(12)
        stop.set()
        stuck = max((time.monotonic() - w[0]) if w[0] else 0.0 for _, w in runs)
        answers = [x for out, _ in runs for x in out]
        kinds: dict[str, int] = {}
        for _, how in answers:
            kinds[how] = kinds.get(how, 0) + 1
        return {"probe": "failover", "publishes": len(answers),
                "longest_answer_s": round(max(t for t, _ in answers), 3),
                "still_waiting_s": round(stuck, 1), "answers": kinds}
    finally:
        for n in nodes:
            n.stop()


def probe_no_link(base: Path, etcd: EtcdProc, secret: Path) -> dict:
    a, b = (_node(base, etcd, n, secret).start() for n in ("a", "b"))
    try:
        conn = a.connect()
        conn.channel().queue_declare("q", durable=True)
        conn.close()
        a.kill()
        _wait(lambda: not _isr(etcd, "q") and _master_gone(etcd), 30)
        out: list = []
        waiting = [0.0]
        stop = threading.Event()
        t = threading.Thread(target=_publisher, args=(b, stop, out, waiting), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not out and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        return {"probe": "no-link",
                "first_answer_s": round(out[0][0], 2) if out else None,
                "first_answer": out[0][1] if out else "none within 30 s"}
    finally:
        b.stop()
        a.stop()


def probe_catch_up(base: Path, etcd: EtcdProc, secret: Path) -> dict:
    a, b = (_node(base, etcd, n, secret, "5").start() for n in ("a", "b"))
    try:
        _policy(a, {"ha-mode": "all"})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        body = b"x" * 1024
        for _ in range(20000):
            ch.basic_publish("", "q", body, pika.BasicProperties(delivery_mode=2))
        ch.confirm_delivery()
        ch.basic_publish("", "q", body, pika.BasicProperties(delivery_mode=2))
        conn.close()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b"], 60, "b in sync")
        b.kill()
        _wait(lambda: _isr(etcd, "q").get("in_sync") == [], 60, "b out of sync")
        conn = a.connect()
        ch = conn.channel()
        for _ in range(1000):
            method, _, _ = ch.basic_get("q")
            ch.basic_ack(method.delivery_tag)
        conn.close()
        _publish(a, 500)
        watch = _Watch(etcd, "b")
        watch.start()
        t0 = time.monotonic()
        b.start()
        try:
            _wait(lambda: _isr(etcd, "q").get("in_sync") == ["b"], 120, "b back in sync")
        except SystemExit:
            print(_isr(etcd, "q"), file=sys.stderr)
            print("\n".join(x for x in a.log().splitlines()[-400:]
                            if "broker.connection" not in x)[-3000:], file=sys.stderr)
            print("\n".join(x for x in b.log().splitlines()[-400:]
                            if "broker.connection" not in x)[-3000:], file=sys.stderr)
            raise
        back = time.monotonic() - t0
        time.sleep(0.5)
        watch.stop.set()
        watch.join()
        import re
        caught = re.findall(r"catches up from its own copy \((\d+) messages kept, (\d+) to "
                            r"send\)", a.log())
        return {"probe": "catch-up", "queue": 19501,
                "sync_total_seen": watch.synced_max,
                "catch_up": ({"kept": int(caught[-1][0]), "sent": int(caught[-1][1])}
                             if caught else None),
                "start_to_in_sync_s": round(back, 2)}
    finally:
        b.stop()
        a.stop()


def _master_gone(etcd: EtcdProc) -> bool:
    import base64

    import httpx
    key = "/c/masters/%2F/q"
    r = httpx.post(f"http://{etcd.endpoint}/v3/kv/range",
                   json={"key": base64.b64encode(key.encode()).decode()})
    return not r.json().get("kvs")


PROBES = {"ack-multiple": probe_ack_multiple, "placement": probe_placement,
          "failover": probe_failover, "no-link": probe_no_link, "catch-up": probe_catch_up}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_defects", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probe", default=",".join(PROBES))
    args = p.parse_args(argv)
    for name in args.probe.split(","):
        with tempfile.TemporaryDirectory(prefix="triomq-probe-") as tmp:
            base = Path(tmp)
            secret = base / "secret"
            secret.write_text("0123456789abcdef-probe-secret\n")
            etcd = EtcdProc(base / "etcd").start()
            try:
                print(json.dumps(PROBES[name](base, etcd, secret)), flush=True)
            finally:
                etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
