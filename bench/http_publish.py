"""Hermes-style HTTP benchmarks against a TrioMQ it starts (docs/performance-http.md).

``publish``: open-loop HTTP publish load at ``--rate`` requests/s over ``--connections``
keep-alive connections from ``--processes`` load processes (plain epoll loops), to the Hermes
frontend (``--hermes-port``) or the management port; each request has a due time on a fixed
schedule and its latency counts from that due time, so a stalled broker cannot hide its
queueing (no coordinated omission). Reports the achieved rate, status codes, latency
percentiles and the broker's CPU per request.

``push``: ``--messages`` messages published over AMQP (rawamqp) to a topic whose subscription
is suspended, then the subscription is activated and the time until a local endpoint (a
minimal HTTP/1.1 server on trio in this process) has answered 2xx for all of them gives
msg/s. ``--delivery serial`` sends one message per request (``--inflight`` at once),
``--delivery batch`` ``--batch-size`` per request.

    .venv/bin/python -m bench.http_publish publish --rate 1000 --duration 10
    .venv/bin/python -m bench.http_publish push --messages 20000 --delivery serial
    .venv/bin/python -m bench.http_publish push --messages 50000 --delivery batch

Nothing from ``broker/`` is imported: the broker is a subprocess (``--broker-arg``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx
import trio

from .procinfo import TrioMQProcess, cpu_seconds, free_port, rss_kb

AUTH = ("guest", "guest")


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def start_broker(a) -> tuple[TrioMQProcess, int, int]:
    """The broker, its management HTTP port and its Hermes frontend port."""
    http_port = free_port()
    front_port = free_port()
    extra = ["--http-port", str(http_port), "--hermes-port", str(front_port), *a.broker_arg]
    broker = TrioMQProcess(store=a.store, extra_args=extra, quiet=True).start()
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{http_port}/topics", timeout=2, auth=AUTH)
            return broker, http_port, front_port
        except httpx.TransportError:
            if time.monotonic() > deadline:
                broker.stop()
                raise RuntimeError("the broker's HTTP listener did not come up") from None
            time.sleep(0.1)


# ---- publish latency ------------------------------------------------------------------------
def load_process(host: str, port: int, topic: str, rate: float, total: int, warmup_n: int,
                 connections: int, body: bytes, start_at: float, out) -> None:
    """Open-loop load from one process (a plain epoll loop; httpx on trio could not drive
    1,000 requests/s here): request i is due at ``start_at + i / rate`` and goes out on an
    idle keep-alive connection; its latency counts from its due time, so waiting for a free
    connection counts too. Puts ``(latencies after warm-up, statuses, errors)`` on ``out``."""
    import selectors
    import socket

    head = (f"POST /topics/{topic} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"  # guest:guest
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    request = head + body
    sel = selectors.DefaultSelector()
    idle = []
    for _ in range(connections):
        c = socket.create_connection((host, port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ, [b"", None])
        idle.append(c)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    sent = done = 0
    while done < total:
        now = time.monotonic()
        while sent < total and idle and start_at + sent / rate <= now:
            c = idle.pop()
            sel.get_key(c).data[1] = (sent, start_at + sent / rate)
            c.sendall(request)
            sent += 1
        next_due = start_at + sent / rate if sent < total else now + 1
        timeout = max(0.0, next_due - time.monotonic()) if idle else 1.0
        for key, _ in sel.select(timeout):
            state = key.data
            c = key.fileobj
            data = c.recv(65536)
            if not data:
                errors += 1
                done += 1
                sel.unregister(c)
                continue
            state[0] += data
            buf = state[0]
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            lower = buf[:end].lower()
            i = lower.find(b"content-length:")
            length = int(lower[i + 15:].split(b"\r\n", 1)[0]) if i >= 0 else 0
            if len(buf) < end + 4 + length:
                continue
            status = int(buf[9:12])
            state[0] = buf[end + 4 + length:]
            index, due = state[1]
            statuses[status] = statuses.get(status, 0) + 1
            if index >= warmup_n:
                latencies.append(time.monotonic() - due)
            done += 1
            idle.append(c)
    out.put((latencies, statuses, errors))


def _publish_load(target_port: int, topic: str, rate: float, duration: float, warmup: float,
                  connections: int, size: int, processes: int) -> dict:
    import multiprocessing as mp
    body = json.dumps({"pad": "x" * max(0, size - 12)}).encode()
    per = rate / processes
    total = int(per * (duration + warmup))
    warmup_n = int(per * warmup)
    out: mp.Queue = mp.Queue()
    start_at = time.monotonic() + 1.0
    procs = [mp.Process(target=load_process,
                        args=("127.0.0.1", target_port, topic, per, total, warmup_n,
                              max(1, connections // processes), body, start_at, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    for _ in procs:
        lat, st, err = out.get(timeout=duration + warmup + 120)
        latencies += lat
        errors += err
        for k, v in st.items():
            statuses[k] = statuses.get(k, 0) + v
    elapsed = time.monotonic() - start_at
    for p in procs:
        p.join(10)
    latencies.sort()
    requests = total * processes
    return {"requests": requests, "measured": len(latencies), "elapsed_s": round(elapsed, 2),
            "achieved_rps": round(requests / elapsed, 1), "statuses": statuses, "errors": errors,
            "p50_ms": round(percentile(latencies, 50) * 1000, 3),
            "p95_ms": round(percentile(latencies, 95) * 1000, 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "p999_ms": round(percentile(latencies, 99.9) * 1000, 3),
            "max_ms": round(latencies[-1] * 1000, 3) if latencies else None}


def cmd_publish(a) -> dict:
    broker, http_port, front_port = start_broker(a)
    base = f"http://127.0.0.1:{http_port}"
    target = front_port if a.port == "frontend" else http_port
    try:
        httpx.post(f"{base}/topics", json={"name": "bench.publish", "ack": a.ack},
                   auth=AUTH).raise_for_status()
        httpx.post(f"{base}/topics/bench.publish/subscriptions",
                   json={"name": "sink", "endpoint": "http://127.0.0.1:9/", "state": "SUSPENDED"},
                   auth=AUTH).raise_for_status()
        cpu0 = cpu_seconds(broker.pid)
        result = _publish_load(target, "bench.publish", a.rate, a.duration, a.warmup,
                               a.connections, a.size, a.processes)
        cpu1 = cpu_seconds(broker.pid)
        result["broker_cpu_pct"] = round(100 * (cpu1 - cpu0) / result["elapsed_s"], 1) \
            if cpu0 is not None and cpu1 is not None else None
        result["broker_cpu_ms_per_request"] = round(1000 * (cpu1 - cpu0) / result["requests"], 3) \
            if cpu0 is not None and cpu1 is not None else None
        result["broker_rss_mb"] = round((rss_kb(broker.pid) or 0) / 1024, 1)
        result["group_commits"] = _group_commits(base)
        return result
    finally:
        broker.stop()


def _group_commits(base: str) -> dict | None:
    """The journal's write+fdatasync durations over the run (the broker's /metrics
    histogram): what an ``ack ALL`` publish waits for, up to two of them."""
    try:
        text = httpx.get(f"{base}/metrics", auth=AUTH, timeout=10).text
    except httpx.HTTPError:
        return None
    buckets = {}
    for line in text.splitlines():
        if line.startswith("triomq_store_sync_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("triomq_store_sync_seconds_count"):
            buckets["count"] = float(line.rsplit(" ", 1)[1])
    count = buckets.get("count") or 0
    if not count:
        return None
    over = {f"over_{ms}ms_pct": round(100 * (1 - buckets.get(le, count) / count), 2)
            for ms, le in (("2.5", "0.0025"), ("5", "0.005"), ("10", "0.01"), ("25", "0.025"))}
    return {"commits": int(count), **over}


# ---- push throughput --------------------------------------------------------------------------
def sink_process(port: int, batch: bool, counter, ready) -> None:
    """A minimal HTTP/1.1 endpoint in its own process (a plain epoll loop, cheaper per
    request than any framework): answers 200 to every POST and counts messages -- requests,
    or the items of a Hermes batch -- in ``counter``."""
    import selectors
    import socket

    sel = selectors.DefaultSelector()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    buffers: dict = {}
    ready.set()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    while True:
        for key, _ in sel.select():
            if key.data is None:
                conn, _addr = listener.accept()
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(conn, selectors.EVENT_READ, True)
                buffers[conn] = b""
                continue
            conn = key.fileobj
            try:
                data = conn.recv(262144)
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                buffers.pop(conn, None)
                conn.close()
                continue
            buf = buffers[conn] + data
            out = []
            n = 0
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = buf[:end].lower()
                i = head.find(b"content-length:")
                length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0
                                   else len(head)]) if i >= 0 else 0
                if len(buf) < end + 4 + length:
                    break
                body = buf[end + 4:end + 4 + length]
                buf = buf[end + 4 + length:]
                n += body.count(b'"metadata"') if batch else 1
                out.append(reply)
            buffers[conn] = buf
            if out:
                conn.sendall(b"".join(out))
                with counter.get_lock():
                    counter.value += n


async def _push(a, http_port: int, amqp_url: str, broker_pid: int | None = None) -> dict:
    import multiprocessing as mp
    batch = a.delivery == "batch"
    sink_port = free_port()
    counter = mp.Value("q", 0)
    ready = mp.Event()
    sink = mp.Process(target=sink_process, args=(sink_port, batch, counter, ready), daemon=True)
    sink.start()
    ready.wait(10)
    base = f"http://127.0.0.1:{http_port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30, auth=AUTH) as http:
            (await http.post("/topics", json={"name": "bench.push", "ack": "LEADER"})).raise_for_status()
            sub = {"name": "sink", "endpoint": f"http://127.0.0.1:{sink_port}/", "state": "SUSPENDED",
                   "deliveryType": "BATCH" if batch else "SERIAL",
                   "subscriptionPolicy": {"rate": a.max_rate, "inflightSize": a.inflight,
                                          "requestTimeout": 5000},
                   "batchSubscriptionPolicy": {"batchSize": a.batch_size, "batchTime": 50,
                                               "batchVolume": 1 << 20}}
            (await http.post("/topics/bench.push/subscriptions", json=sub)).raise_for_status()
            body = json.dumps({"pad": "x" * max(0, a.size - 12)}).encode()
            await trio.to_thread.run_sync(_amqp_fill, amqp_url, a.messages, body)
            cpu0 = cpu_seconds(broker_pid) if broker_pid else None
            t0 = trio.current_time()
            r = await http.put("/topics/bench.push/subscriptions/sink/state", content=b'"ACTIVE"')
            r.raise_for_status()
            with trio.fail_after(a.timeout):
                while counter.value < a.messages:  # noqa: ASYNC110 - another process counts
                    await trio.sleep(0.005)
            elapsed = trio.current_time() - t0
            cpu1 = cpu_seconds(broker_pid) if broker_pid else None
            metrics = (await http.get("/topics/bench.push/subscriptions/sink/metrics")).json()
    finally:
        sink.kill()
        sink.join(5)
    result = {"messages": counter.value, "elapsed_s": round(elapsed, 3),
              "msg_per_s": round(counter.value / elapsed, 1), "subscription": metrics}
    if cpu0 is not None and cpu1 is not None:  # the push alone, not the AMQP fill before it
        result["broker_cpu_s"] = round(cpu1 - cpu0, 2)
        result["broker_cpu_us_per_msg"] = round(1e6 * (cpu1 - cpu0) / max(1, counter.value), 1)
        result["broker_cpu_pct"] = round(100 * (cpu1 - cpu0) / elapsed, 1)
    return result


def _amqp_fill(url: str, n: int, body: bytes) -> None:
    import pika  # the fill is not measured: any AMQP client does
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2)
    for _ in range(n):
        ch.basic_publish("bench.push", "k", body, props)
    ch.queue_declare("bench.push.sink", passive=True)  # a round trip: every publish was read
    conn.close()


def cmd_push(a) -> dict:
    broker, http_port, _front = start_broker(a)
    try:
        result = trio.run(_push, a, http_port, broker.url, broker.pid)
        result["broker_rss_mb"] = round((rss_kb(broker.pid) or 0) / 1024, 1)
        return result
    finally:
        broker.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_publish", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("publish", "push"):
        s = sub.add_parser(name)
        s.add_argument("--store", default=None, help="the broker's --store (default: journal)")
        s.add_argument("--broker-arg", action="append", default=[], help="one more broker argument")
        s.add_argument("--size", type=int, default=256, help="body bytes (JSON)")
        s.add_argument("--json", help="write the result to this file")
    pub = sub.choices["publish"]
    pub.add_argument("--rate", type=float, default=1000.0, help="requests per second (open loop)")
    pub.add_argument("--duration", type=float, default=10.0)
    pub.add_argument("--warmup", type=float, default=2.0)
    pub.add_argument("--connections", type=int, default=16, help="keep-alive connections in all")
    pub.add_argument("--processes", type=int, default=1, help="load generator processes")
    pub.add_argument("--port", choices=("frontend", "management"), default="frontend",
                     help="publish to the Hermes frontend (--hermes-port) or the management port")
    pub.add_argument("--ack", choices=("ALL", "LEADER"), default="ALL",
                     help="topic ack: ALL answers 201 once stored (fsync), LEADER 202 once routed")
    push = sub.choices["push"]
    push.add_argument("--messages", type=int, default=20000)
    push.add_argument("--delivery", choices=("serial", "batch"), default="serial")
    push.add_argument("--inflight", type=int, default=100)
    push.add_argument("--batch-size", type=int, default=100)
    push.add_argument("--max-rate", type=float, default=100000.0, help="the subscription's rate limit")
    push.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args(argv)
    print("command:", " ".join([os.path.basename(sys.executable), "-m", "bench.http_publish",
                                *(argv if argv is not None else sys.argv[1:])]), flush=True)
    result = cmd_publish(a) if a.command == "publish" else cmd_push(a)
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": a.command, "args": vars(a), "result": result}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
