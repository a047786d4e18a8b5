"""MQTT over TCP, TLS, WebSockets and secure WebSockets on one TrioMQ: messages per second and
the broker's CPU per message, same load, one broker process for every round.

    .venv/bin/python -m bench.mqtt_ws [--qos 0|1] [--window 64] [--size 64] [--duration 5]
                                      [--warmup 1] [--repeats 3] [--sys-interval 10]

One subscriber and one publisher per round, both on the transport measured; a publisher
keeps ``--window`` PUBLISHes unacknowledged (PUBACK at QoS 1; at QoS 0 a PINGREQ after each
``--window`` PUBLISHes, at most two batches without PINGRESP). Each write of the load tool
is one WebSocket frame (wsproto's client, masked as clients must). The figures are the
messages the subscriber got per second in the measured window and the broker process's
CPU seconds (utime+stime) in it divided by them. ``--sys-interval`` is passed on as
``--mqtt-sys-interval`` (0: no $SYS rounds), to see what the $SYS rounds cost.
"""
from __future__ import annotations

import argparse
import os
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
import uuid

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Message, Ping, RejectConnection, Request

from .mqtt import Parser, answers, connect_packet, publish_packet, subscribe_packet
from .procinfo import TrioMQProcess, cpu_seconds, free_port


class Transport:
    """MQTT bytes over a TCP socket, or inside WebSocket binary frames (ws, wss)."""

    def __init__(self, kind: str, port: int):
        self.kind = kind
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if kind in ("wss", "mqtts"):
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # the bench's own self-signed certificate
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        self.sock = s
        self.ws: WSConnection | None = None
        if kind in ("ws", "wss"):
            ws = self.ws = WSConnection(ConnectionType.CLIENT)
            s.sendall(ws.send(Request(host="127.0.0.1", target="/ws", subprotocols=["mqtt"])))
            while True:
                ws.receive_data(s.recv(65536))
                events = list(ws.events())
                if any(isinstance(e, RejectConnection) for e in events):
                    raise RuntimeError("upgrade refused")
                if any(isinstance(e, AcceptConnection) for e in events):
                    break

    def send(self, data: bytes) -> None:
        if self.ws is None:
            self.sock.sendall(data)
        else:
            self.sock.sendall(self.ws.send(Message(data=data)))

    def recv(self) -> bytes:
        data = self.sock.recv(262144)
        if self.ws is None or not data:
            return data
        self.ws.receive_data(data)
        out = []
        for ev in self.ws.events():
            if isinstance(ev, BytesMessage):
                out.append(bytes(ev.data))
            elif isinstance(ev, Ping):
                self.sock.sendall(self.ws.send(ev.response()))
        return b"".join(out)

    def close(self) -> None:
        self.sock.close()


def _open(kind: str, port: int) -> tuple[Transport, Parser]:
    t = Transport(kind, port)
    t.send(connect_packet("b-" + uuid.uuid4().hex[:8]))
    parser = Parser()
    while True:
        packets = parser.feed(t.recv())
        if packets:
            if packets[0][0] >> 4 != 2:
                raise RuntimeError("no CONNACK")
            return t, parser


def one_round(kind: str, port: int, broker_pid: int, qos: int, window: int, size: int,
              duration: float, warmup: float) -> tuple[float, float]:
    """(messages per second, broker CPU microseconds per message)."""
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    sub, sparser = _open(kind, port)
    sub.send(subscribe_packet(topic, qos))
    while not any(first >> 4 == 9 for first, _ in sparser.feed(sub.recv())):
        pass
    pub, pparser = _open(kind, port)
    stop = threading.Event()
    counts = {"got": 0, "window_got": 0}
    start_at = time.monotonic() + warmup
    end_at = start_at + duration
    cpu: dict[str, float] = {}

    def subscriber():
        sub.sock.settimeout(1)
        while not stop.is_set():
            try:
                data = sub.recv()
            except (TimeoutError, ssl.SSLError, OSError):
                continue
            acks: list = []
            n = answers(sparser, data, acks)
            if acks:
                sub.send(b"".join(acks))
            now = time.monotonic()
            if start_at <= now < end_at:
                counts["window_got"] += n
                cpu.setdefault("start", cpu_seconds(broker_pid) or 0.0)
            elif now >= end_at and "end" not in cpu:
                cpu["end"] = cpu_seconds(broker_pid) or 0.0
            counts["got"] += n

    def publisher():
        topic_raw = len(topic).to_bytes(2, "big") + topic.encode()
        payload = os.urandom(size)
        pid = 0
        outstanding = 0
        pub.sock.settimeout(1)
        while time.monotonic() < end_at + 0.5:
            limit = 2 if qos == 0 else window
            while outstanding < limit:
                if qos == 0:
                    pub.send(b"".join(publish_packet(topic_raw, 0, payload, 0)
                                      for _ in range(window)) + b"\xc0\x00")
                    outstanding += 1
                else:
                    pid = pid % 65535 + 1
                    pub.send(publish_packet(topic_raw, pid, payload, 1))
                    outstanding += 1
            try:
                data = pub.recv()
            except (TimeoutError, ssl.SSLError, OSError):
                continue
            for first, _ in pparser.feed(data):
                if first >> 4 in (4, 13):  # PUBACK, PINGRESP
                    outstanding -= 1

    threads = [threading.Thread(target=subscriber), threading.Thread(target=publisher)]
    cpu["start"] = cpu_seconds(broker_pid) or 0.0
    for t in threads:
        t.start()
    threads[1].join()
    time.sleep(0.5)
    stop.set()
    threads[0].join()
    for t in (sub, pub):
        t.close()
    got = counts["window_got"]
    used = cpu.get("end", cpu_seconds(broker_pid) or 0.0) - cpu["start"]
    return got / duration, (used / got * 1e6 if got else float("nan"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.mqtt_ws")
    p.add_argument("--qos", type=int, choices=(0, 1), default=1)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sys-interval", default="10")
    args = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="mqttws-bench-")
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    ports = {"tcp": free_port(), "mqtts": free_port(), "ws": free_port(), "wss": free_port()}
    broker = TrioMQProcess(store="memory", quiet=True, extra_args=[
        "--http-port", "0", "--mqtt-port", str(ports["tcp"]), "--mqtt-ws-port", str(ports["ws"]),
        "--mqtt-wss-port", str(ports["wss"]), "--mqtts-port", str(ports["mqtts"]),
        "--tls-cert", cert, "--tls-key", key,
        "--mqtt-sys-interval", args.sys_interval])
    broker.start()
    try:
        deadline = time.monotonic() + 30
        for port in ports.values():
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in ports}
        for r in range(args.repeats):
            for kind, port in ports.items():
                rate, us = one_round(kind, port, broker.pid, args.qos, args.window, args.size,
                                     args.duration, args.warmup)
                results[kind].append((rate, us))
                print(f"round {r + 1} {kind:>5}: {rate:9.0f} msg/s  {us:6.1f} us broker CPU/msg",
                      flush=True)
        print(f"medians (qos {args.qos}, {args.size} B, window {args.window}, "
              f"{args.repeats} rounds):")
        for kind, rows in results.items():
            print(f"  {kind:>5}: {statistics.median(r for r, _ in rows):9.0f} msg/s  "
                  f"{statistics.median(u for _, u in rows):6.1f} us broker CPU/msg")
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
