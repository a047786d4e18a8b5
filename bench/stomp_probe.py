"""STOMP throughput probe: one raw-socket publisher pipelines N SEND frames to /queue/<q>
(one receipt at the end), then one subscriber (ack auto, or client-individual with an ACK
per message) drains them. Against any STOMP server (TrioMQ, RabbitMQ's rabbitmq_stomp).

    python -m bench.stomp_probe --port 61613 [-n 20000] [--size 100] [--ack auto]

Prints messages/s for both sides and the broker's CPU per message (from /proc, the process
listening on --port: root, or the broker's user, can read it). Bounded in time (--timeout)."""
from __future__ import annotations

import argparse
import socket
import time
import uuid

from broker.stomp.codec import Frame, FrameReader, encode

from .procinfo import cpu_seconds, pid_listening_on

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


def _connect(port: int, timeout: float) -> tuple[socket.socket, FrameReader]:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(CONNECT)
    reader = FrameReader(1 << 24)
    reader.version = "1.2"
    frames: list[Frame] = []
    while not frames:
        frames = reader.feed(s.recv(65536))
    assert frames[0].command == "CONNECTED", frames[0]
    return s, reader


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=61613)
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--ack", choices=["auto", "client-individual"], default="auto")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--amqp-url", default=None,
                    help="delete the probe's queue afterwards over AMQP (pika), e.g. on RabbitMQ")
    args = ap.parse_args(argv)
    q = "stomp-probe-" + uuid.uuid4().hex[:8]
    body = b"x" * args.size
    pid = pid_listening_on(args.port)

    def cpu() -> float:
        return (cpu_seconds(pid) or 0.0) if pid is not None else 0.0
    cpu0 = cpu()
    pub, preader = _connect(args.port, args.timeout)
    send = encode(Frame("SEND", {"destination": f"/queue/{q}"}, body))
    t0 = time.perf_counter()
    batch = send * 100
    for _ in range(args.n // 100):
        pub.sendall(batch)
    pub.sendall(encode(Frame("SEND", {"destination": f"/queue/{q}", "receipt": "end"}, body)))
    got: list[Frame] = []
    while not any(f.command == "RECEIPT" for f in got):
        got += preader.feed(pub.recv(65536))
    t_pub = time.perf_counter() - t0
    cpu_pub = cpu() - cpu0
    n = args.n // 100 * 100 + 1
    sub, sreader = _connect(args.port, args.timeout)
    t0 = time.perf_counter()
    sub.sendall(encode(Frame("SUBSCRIBE", {"destination": f"/queue/{q}", "id": "s",
                                           "ack": args.ack})))
    received = 0
    while received < n:
        frames = sreader.feed(sub.recv(1 << 20))
        acks = []
        for f in frames:
            if f.command == "MESSAGE":
                received += 1
                if args.ack != "auto":
                    acks.append(encode(Frame("ACK", {"id": f.headers["ack"]})))
            elif f.command == "ERROR":
                raise SystemExit(f"ERROR: {f.headers} {f.body!r}")
        if acks:
            sub.sendall(b"".join(acks))
    t_sub = time.perf_counter() - t0
    cpu_sub = cpu() - cpu0 - cpu_pub
    # leave nothing behind on the server probed
    sub.sendall(encode(Frame("UNSUBSCRIBE", {"id": "s"})) + b"DISCONNECT\n\n\x00")
    where = f"broker pid {pid}" if pid is not None else "broker CPU unknown"
    print(f"publish  {n} x {args.size} B: {n / t_pub:,.0f} msg/s ({t_pub:.2f} s), "
          f"broker CPU {cpu_pub / n * 1e6:.1f} us/msg ({where})")
    print(f"consume  ack {args.ack}: {n / t_sub:,.0f} msg/s ({t_sub:.2f} s), "
          f"broker CPU {cpu_sub / n * 1e6:.1f} us/msg")
    pub.close()
    sub.close()
    if args.amqp_url:
        import pika
        with pika.BlockingConnection(pika.URLParameters(args.amqp_url)) as conn:
            conn.channel().queue_delete(q)


if __name__ == "__main__":
    main()
