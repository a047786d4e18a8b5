"""Hostile HTTP request bodies against a TrioMQ it starts: does RSS stay bounded while they
arrive, and does it come back once the clients are gone? (docs/security.md, "HTTP request
bodies".)

    python -m bench.http_hostile                      # every case, 8 connections each
    python -m bench.http_hostile --connections 16 --max-body 4194304 --only chunked,declared

Cases, each on ``--connections`` parallel raw sockets (no HTTP library: the bench sends
what a hostile client would):

``declared``  PUT /api/queues/... declaring Content-Length 1 TB, then sending body bytes
              until answered (the broker should answer 413 from the header alone)
``chunked``   PUT /api/queues/... with a chunked body that never ends (64 KiB chunks)
``deep``      PUT /api/queues/... with a body of ``--max-body`` minus 1 KiB of ``[``
``wide``      PUT /api/queues/... with a body of ``--max-body`` minus 1 KiB of ``{},``: valid
              JSON whose decoded objects take ~25 times the body
``hermes``    POST /topics/{topic} on the management port, chunked and endless
``frontend``  POST /topics/{topic} on the Hermes frontend port, Content-Length 1 TB
``frontend-big`` the same with whole bodies of ``--max-body`` bytes to a topic that takes
              them (published when the bodies-in-flight budget allows, else 503)

For each case: the statuses answered (how many connections got each), the body bytes each
connection had sent when the answer came (at most; the kernel's socket buffers hold a few
hundred KiB more), the broker's RSS before, its peak while the case ran (sampled every
10 ms) and 3 s after the clients closed.
"""
from __future__ import annotations

import argparse
import base64
import socket
import sys
import threading
import time

import httpx

from .procinfo import TrioMQProcess, free_port, rss_kb

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
CHUNK = 64 * 1024
CASES = ("declared", "chunked", "deep", "wide", "hermes", "frontend", "frontend-big")


class Sampler(threading.Thread):
    """The broker's peak RSS (kB) while running."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_kb(self.pid) or 0)
            time.sleep(0.01)


def _head(method: str, path: str, headers: dict) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: {AUTH}",
             "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(data: bytes) -> str:
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    return line.split(" ", 2)[1] if line.startswith("HTTP/") else "closed"


def hostile(port: int, method: str, path: str, headers: dict, body_chunks, limit: int,
            timeout: float = 30.0) -> tuple[str, int]:
    """Send the head, then body pieces until the server answers or closes, or ``limit``
    bytes went out; (status, body bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sent = 0
    answer = b""
    try:
        sock.sendall(_head(method, path, headers))
        sock.setblocking(False)
        deadline = time.monotonic() + timeout
        for piece in body_chunks:
            try:
                answer += sock.recv(65536)
                if answer or sent >= limit:
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            if time.monotonic() > deadline:
                break
            try:
                sock.setblocking(True)
                sock.settimeout(1.0)
                sock.sendall(piece)
                sent += len(piece)
            except TimeoutError:  # the server stopped reading: it answers
                pass
            except OSError:
                break
            finally:
                sock.setblocking(False)
        sock.setblocking(True)
        sock.settimeout(timeout)
        try:
            while b"\r\n" not in answer:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except OSError:
            pass
        return _status(answer), sent
    finally:
        sock.close()


def _endless_chunked():
    piece = f"{CHUNK:x}\r\n".encode() + b" " * CHUNK + b"\r\n"
    while True:
        yield piece


def _raw(data: bytes):
    for i in range(0, len(data), CHUNK):
        yield data[i:i + CHUNK]


def _case(name: str, http: int, frontend: int, max_body: int):
    """(port, method, path, headers, chunks factory, send limit)"""
    big = {"Content-Length": str(10 ** 12)}
    chunked = {"Transfer-Encoding": "chunked"}
    limit = 4 * max_body
    if name == "declared":
        return http, "PUT", "/api/queues/%2F/hostile", big, lambda: _raw(b" " * limit), limit
    if name == "chunked":
        return http, "PUT", "/api/queues/%2F/hostile", chunked, _endless_chunked, limit
    if name == "deep":
        body = b"[" * (max_body - 1024)
        return (http, "PUT", "/api/queues/%2F/hostile", {"Content-Length": str(len(body))},
                lambda: _raw(body), len(body))
    if name == "wide":
        body = b"[" + b"{}," * ((max_body - 1024) // 3) + b"{}]"
        return (http, "PUT", "/api/queues/%2F/hostile", {"Content-Length": str(len(body))},
                lambda: _raw(body), len(body))
    if name == "hermes":
        return http, "POST", "/topics/bench.hostile", chunked, _endless_chunked, limit
    if name == "frontend":
        return frontend, "POST", "/topics/bench.hostile", big, lambda: _raw(b" " * limit), limit
    if name == "frontend-big":
        body = b"{}" + b" " * (max_body - 2)
        return (frontend, "POST", "/topics/bench.big", {"Content-Length": str(len(body))},
                lambda: _raw(body), len(body))
    raise ValueError(name)


def run_case(pid: int, name: str, http: int, frontend: int, max_body: int,
             connections: int) -> dict:
    port, method, path, headers, chunks, limit = _case(name, http, frontend, max_body)
    before = rss_kb(pid) or 0
    sampler = Sampler(pid)
    sampler.start()
    results: list = [None] * connections

    def one(i: int) -> None:
        results[i] = hostile(port, method, path, headers, chunks(), limit)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    time.sleep(3)  # the broker's periodic check gives freed heap back (malloc_trim)
    after = rss_kb(pid) or 0
    counts: dict[str, int] = {}
    for r in results:
        if r:
            counts[r[0]] = counts.get(r[0], 0) + 1
    return {"case": name, "status": ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
            "sent_max": max(r[1] for r in results if r), "seconds": elapsed,
            "rss_before": before, "rss_peak": sampler.peak, "rss_after": after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--max-body", type=int, default=20 * 1024 * 1024,
                        help="the broker's --http-max-body (default 20 MiB, its default)")
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    args = parser.parse_args(argv)
    print("$ python -m bench.http_hostile " + " ".join(sys.argv[1:] if argv is None else argv))
    http, frontend = free_port(), free_port()
    broker = TrioMQProcess(store="memory", extra_args=[
        "--http-port", str(http), "--hermes-port", str(frontend),
        "--http-max-body", str(args.max_body)], quiet=True)
    with broker:
        base = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.post(f"{base}/topics", json={"name": "bench.hostile"},
                               auth=("guest", "guest"), timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert r.status_code in (201, 409), r.text
        r = httpx.post(f"{base}/topics", json={"name": "bench.big", "maxMessageSize": args.max_body},
                       auth=("guest", "guest"), timeout=5)
        assert r.status_code in (201, 409), r.text
        print(f"broker pid {broker.pid}, --http-max-body {args.max_body}, "
              f"{args.connections} connections per case")
        print("| case | answer | body bytes sent before the answer (max) | s | RSS before | "
              "RSS peak | RSS 3 s after |")
        print("|---|---|---|---|---|---|---|")
        for name in args.only.split(","):
            res = run_case(broker.pid, name, http, frontend, args.max_body, args.connections)
            print(f"| {res['case']} | {res['status']} | {res['sent_max'] / 2**20:.1f} MiB | "
                  f"{res['seconds']:.1f} | {res['rss_before'] / 1024:.0f} MiB | "
                  f"{res['rss_peak'] / 1024:.0f} MiB | {res['rss_after'] / 1024:.0f} MiB |")
        alive = httpx.get(f"{base}/api/overview", auth=("guest", "guest"), timeout=10)
        print(f"afterwards: GET /api/overview -> {alive.status_code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
