"""MQTT benchmarks: TrioMQ (started here) and the machine's Mosquitto, same load tool, one run.

    .venv/bin/python -m bench.mqtt throughput [--qos 0|1|2] [--publishers 2] [--window 64]
                                              [--size 64] [--duration 10] [--warmup 2]
                                              [--prefetch 20] [--repeats 5]
                                              [--session clean|persistent]
    .venv/bin/python -m bench.mqtt fanout [--subscribers 1000] [--qos 1] [--window 10] ...
    .venv/bin/python -m bench.mqtt connections [--count 10000]

``throughput``: one subscriber (clean session unless ``--session persistent``) on
``bench/<run>/#`` and N publishers, both at ``--qos``: QoS 1 answers every delivery with
PUBACK, QoS 2 goes through PUBREC/PUBREL/PUBCOMP both ways. A publisher keeps at most
``--window`` PUBLISHes unacknowledged (PUBACK, or PUBCOMP at QoS 2); at QoS 0, which has no
acknowledgement, it sends ``--window`` PUBLISHes then a PINGREQ and keeps at most two such
batches without PINGRESP (a broker answers the PINGREQ after the PUBLISHes before it). The
figure is the messages the subscriber received per second in the measured window.

``fanout``: ``--subscribers`` connections (spread over ``--sub-procs`` processes) subscribe
to one topic at ``--qos``; one publisher publishes to it as in ``throughput``; the figure is
deliveries per second summed over the subscribers. TrioMQ gets
``--mqtt-prefetch`` equal to Mosquitto's default ``max_inflight_messages`` (20). Each of
``--repeats`` rounds measures TrioMQ (one broker process for all rounds) and then Mosquitto
with the same clients, QoS, message count limits and size; every round prints both figures,
the ratio and each broker's CPU use in the measured window (its process's utime+stime), and
the end the median ratio. ``published`` counts PUBACKed publishes, ``received`` every
delivery the subscriber got: Mosquitto drops QoS 1 messages beyond ``max_queued_messages``
(1000 by default) when its subscriber falls behind, TrioMQ queues them.

``connections``: opens ``--count`` MQTT connections (CONNECT, keep-alive 0, wait for every
CONNACK), holds them, and reads each broker's RSS from /proc.

The load tool is raw sockets with a tiny MQTT encoder written here (nothing from broker/),
one process per client role. Extra TrioMQ arguments: ``--broker-arg X`` (repeatable).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import selectors
import shlex
import socket
import statistics
import struct
import sys
import time
import uuid

from .procinfo import TrioMQProcess, cpu_seconds, free_port, pid_listening_on, rss_kb

MOSQUITTO = ("127.0.0.1", 1883)


# ---- a minimal MQTT 3.1.1 client encoding ---------------------------------------------------
def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">H", len(raw)) + raw


def connect_packet(client_id: str, keep_alive: int = 0, clean: bool = True) -> bytes:
    body = (_str("MQTT") + bytes((4, 0x02 if clean else 0)) + struct.pack(">H", keep_alive)
            + _str(client_id))
    return b"\x10" + _length(len(body)) + body


def subscribe_packet(topic: str, qos: int) -> bytes:
    body = struct.pack(">H", 1) + _str(topic) + bytes((qos,))
    return b"\x82" + _length(len(body)) + body


def publish_packet(topic_raw: bytes, pid: int, payload: bytes, qos: int = 1) -> bytes:
    if not qos:
        body = topic_raw + payload
        return b"\x30" + _length(len(body)) + body
    body = topic_raw + struct.pack(">H", pid) + payload
    return bytes((0x30 | qos << 1,)) + _length(len(body)) + body


PINGREQ = b"\xc0\x00"


def answers(parser: Parser, data: bytes, acks: list) -> int:
    """A subscriber's side: the deliveries in ``data`` (counted) and what they need back
    (PUBACK; PUBREC, and PUBCOMP for a PUBREL) appended to ``acks``."""
    n = 0
    for first, body in parser.feed(data):
        kind = first >> 4
        if kind == 3:
            n += 1
            qos = (first >> 1) & 3
            if qos:
                tlen = struct.unpack_from(">H", body)[0]
                acks.append((b"\x40\x02" if qos == 1 else b"\x50\x02") + body[2 + tlen:4 + tlen])
        elif kind == 6:  # PUBREL
            acks.append(b"\x70\x02" + body[:2])
    return n


class Parser:
    """Splits a stream into (first byte, body) packets."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self.buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        n = len(buf)
        while n - pos >= 2:
            length, mult, i = 0, 1, pos + 1
            while True:
                if i >= n:
                    del buf[:pos]
                    return out
                b = buf[i]
                length += (b & 0x7F) * mult
                i += 1
                if not b & 0x80:
                    break
                mult *= 128
            if n - i < length:
                break
            out.append((buf[pos], bytes(buf[i:i + length])))
            pos = i + length
        del buf[:pos]
        return out


def _open(addr, client_id: str, keep_alive: int = 0,
          clean: bool = True) -> tuple[socket.socket, Parser]:
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(connect_packet(client_id, keep_alive, clean))
    parser = Parser()
    while True:
        packets = parser.feed(s.recv(4096))
        if packets:
            first, body = packets[0]
            if first >> 4 != 2 or body[1] != 0:
                raise RuntimeError(f"CONNACK refused: {body!r}")
            return s, parser


# ---- throughput workers --------------------------------------------------------------------
def _subscriber(addr, topic, start_at, end_at, ready, results, clean=True, qos=1):
    client_id = "sub-" + uuid.uuid4().hex[:8]
    s, parser = _open(addr, client_id, clean=clean)
    s.sendall(subscribe_packet(topic, qos))
    got_suback = False
    while not got_suback:
        got_suback = any(first >> 4 == 9 for first, _ in parser.feed(s.recv(4096)))
    ready.set()
    s.settimeout(1.0)
    counted = total = 0
    while time.time() < end_at:
        try:
            data = s.recv(1 << 18)
        except TimeoutError:
            continue
        if not data:
            break
        acks: list[bytes] = []
        n = answers(parser, data, acks)
        total += n
        now = time.time()
        if start_at <= now < end_at:
            counted += n
        if acks:
            s.sendall(b"".join(acks))
    results.put(("sub", counted, total))
    s.close()
    if not clean:  # leave nothing behind in the machine's Mosquitto: a clean CONNECT ends it
        s, _ = _open(addr, client_id, clean=True)
        s.sendall(b"\xe0\x00")
        s.close()


def _publisher(addr, topic, payload, window, end_at, ready, results, qos=1):
    s, parser = _open(addr, "pub-" + uuid.uuid4().hex[:8])
    ready.wait(30)
    topic_raw = _str(topic)
    inflight = 0  # QoS 0: batches sent without PINGRESP; else PUBLISHes without PUBACK/PUBCOMP
    limit = 2 if qos == 0 else window
    pid = 0
    sent = acked = 0
    s.settimeout(1.0)
    while time.time() < end_at:
        if inflight < limit:
            batch = []
            if qos == 0:
                while inflight < limit:
                    batch += [publish_packet(topic_raw, 0, payload, 0)] * window
                    batch.append(PINGREQ)
                    inflight += 1
                    sent += window
            else:
                while inflight < window:
                    pid = pid % 65535 + 1
                    batch.append(publish_packet(topic_raw, pid, payload, qos))
                    inflight += 1
                    sent += 1
            s.sendall(b"".join(batch))
        try:
            data = s.recv(1 << 16)
        except TimeoutError:
            continue
        if not data:
            break
        rels = []
        for first, body in parser.feed(data):
            kind = first >> 4
            if kind == 4 or kind == 7:  # PUBACK, PUBCOMP
                inflight -= 1
                acked += 1
            elif kind == 5:  # PUBREC: release it
                rels.append(b"\x62\x02" + body[:2])
            elif kind == 13:  # PINGRESP: a QoS 0 batch went through
                inflight -= 1
                acked += window
        if rels:
            s.sendall(b"".join(rels))
    results.put(("pub", acked, sent))
    s.close()


def throughput(addr, publishers: int, window: int, size: int, duration: float,
               warmup: float, broker_pid: int | None = None, clean: bool = True,
               qos: int = 1) -> dict:
    run = uuid.uuid4().hex[:8]
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    ready = ctx.Event()
    t0 = time.time() + 3.0  # spawn time
    start_at, end_at = t0 + warmup, t0 + warmup + duration
    sub = ctx.Process(target=_subscriber, args=(addr, f"bench/{run}/#", start_at, end_at, ready,
                                                results, clean, qos))
    sub.start()
    pubs = [ctx.Process(target=_publisher, args=(addr, f"bench/{run}/p{i}", b"x" * size, window,
                                                 end_at, ready, results, qos))
            for i in range(publishers)]
    for p in pubs:
        p.start()
    cpu = None
    if broker_pid:  # the broker's CPU seconds over the measured window
        time.sleep(max(0.0, start_at - time.time()))
        before = cpu_seconds(broker_pid)
        time.sleep(max(0.0, end_at - time.time()))
        after = cpu_seconds(broker_pid)
        if before is not None and after is not None:
            cpu = (after - before) / duration
    out = [results.get(timeout=duration + warmup + 60) for _ in range(publishers + 1)]
    for p in [sub, *pubs]:
        p.join(10)
    counted = sum(c for kind, c, _ in out if kind == "sub")
    received = sum(t for kind, _, t in out if kind == "sub")
    sent = sum(c for kind, c, _ in out if kind == "pub")
    return {"msg_per_s": round(counted / duration), "published": sent, "received": received,
            "cpu": round(cpu, 2) if cpu is not None else None,
            # what one second of the broker's CPU moved: steadier than msg/s on a shared
            # machine, where each broker gets what the other processes leave
            "msg_per_cpu_s": round(counted / duration / cpu) if cpu else None}


# ---- fan-out ---------------------------------------------------------------------------------
def _fan_subscribers(addr, topic, count, qos, start_at, end_at, ready, results):
    """``count`` subscribers in this process, read with one selector."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(count):
        s, parser = _open(addr, "fan-" + uuid.uuid4().hex[:10])
        s.sendall(subscribe_packet(topic, qos))
        while not any(first >> 4 == 9 for first, _ in parser.feed(s.recv(4096))):
            pass
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, parser)
        socks.append(s)
    ready.put(count)
    counted = total = 0
    while time.time() < end_at:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                data = s.recv(1 << 18)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(s)
                continue
            acks: list[bytes] = []
            n = answers(key.data, data, acks)
            total += n
            if start_at <= time.time() < end_at:
                counted += n
            if acks:
                s.setblocking(True)
                s.sendall(b"".join(acks))
                s.setblocking(False)
    results.put(("sub", counted, total))
    for s in socks:
        s.close()


def fanout(addr, subscribers: int, sub_procs: int, qos: int, window: int, size: int,
           duration: float, warmup: float, broker_pid: int | None = None) -> dict:
    run = uuid.uuid4().hex[:8]
    topic = f"fan/{run}"
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    ready_q: mp.Queue = ctx.Queue()
    ready = ctx.Event()
    setup = 10.0 + subscribers / 200  # time to connect and subscribe everyone
    t0 = time.time() + setup
    start_at, end_at = t0 + warmup, t0 + warmup + duration
    per = [subscribers // sub_procs + (1 if i < subscribers % sub_procs else 0)
           for i in range(sub_procs)]
    subs = [ctx.Process(target=_fan_subscribers, args=(addr, topic, n, qos, start_at, end_at,
                                                       ready_q, results)) for n in per]
    for p in subs:
        p.start()
    pub = ctx.Process(target=_publisher, args=(addr, topic, b"x" * size, window, end_at, ready,
                                               results, qos))
    pub.start()
    connected = sum(ready_q.get(timeout=setup + 60) for _ in subs)
    ready.set()
    late = time.time() > start_at
    cpu = None
    if broker_pid:
        time.sleep(max(0.0, start_at - time.time()))
        before = cpu_seconds(broker_pid)
        time.sleep(max(0.0, end_at - time.time()))
        after = cpu_seconds(broker_pid)
        if before is not None and after is not None:
            cpu = (after - before) / duration
    out = [results.get(timeout=duration + warmup + 60) for _ in range(len(subs) + 1)]
    for p in [*subs, pub]:
        p.join(10)
    counted = sum(c for kind, c, _ in out if kind == "sub")
    pubs = [(c, t) for kind, c, t in out if kind == "pub"]
    return {"subscribers": connected, "deliveries_per_s": round(counted / duration),
            "published": pubs[0][1], "acked": pubs[0][0],
            "received": sum(t for kind, _, t in out if kind == "sub"),
            "cpu": round(cpu, 2) if cpu is not None else None,
            "setup_overran": late}


# ---- idle connections ------------------------------------------------------------------------
def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def hold_connections(addr, count: int, broker_pid: int | None) -> dict:
    """Open ``count`` connections (a few hundred CONNECTs in flight at once), wait for every
    CONNACK, then read the broker's RSS while they are all held."""
    rss_before = rss_kb(broker_pid) if broker_pid else None
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    socks_by_fd: dict[int, socket.socket] = {}
    pending = 0
    t0 = time.monotonic()
    opened = 0
    refused = 0
    while opened < count or pending:
        while opened < count and pending < 500:
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(addr)
            except BlockingIOError:
                pass
            sel.register(s, selectors.EVENT_WRITE, [b"", False])
            socks.append(s)
            socks_by_fd[s.fileno()] = s
            opened += 1
            pending += 1
        for key, ev in sel.select(timeout=5):
            s, state = socks_by_fd[key.fd], key.data
            if ev & selectors.EVENT_WRITE and not state[1]:
                try:
                    s.send(connect_packet("idle-" + uuid.uuid4().hex[:10]))
                except OSError:
                    refused += 1
                    pending -= 1
                    sel.unregister(s)
                    continue
                state[1] = True
                sel.modify(s, selectors.EVENT_READ, state)
                continue
            try:
                data = s.recv(16)
            except OSError:
                data = b""
            state[0] += data
            if len(state[0]) >= 4 or not data:
                if not data or state[0][3] != 0:
                    refused += 1
                sel.unregister(s)
                pending -= 1
    elapsed = time.monotonic() - t0
    time.sleep(2.0)
    rss = rss_kb(broker_pid) if broker_pid else None
    alive = 0
    for s in socks:  # still open: a non-blocking read finds nothing (not EOF)
        try:
            if s.recv(1):
                alive += 1
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    for s in socks:
        s.close()
    return {"connected": count - refused, "held": alive, "seconds": elapsed,
            "rss_mb": rss / 1024 if rss else None,
            "rss_before_mb": rss_before / 1024 if rss_before else None,
            "kb_per_connection": (rss - rss_before) / max(alive, 1) if rss and rss_before
            else None}


# ---- command line ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.mqtt")
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--publishers", type=int, default=2)
    t.add_argument("--window", type=int, default=64)
    t.add_argument("--size", type=int, default=64)
    t.add_argument("--duration", type=float, default=10.0)
    t.add_argument("--warmup", type=float, default=2.0)
    t.add_argument("--prefetch", type=int, default=20)
    t.add_argument("--repeats", type=int, default=5)
    t.add_argument("--session", choices=("clean", "persistent"), default="clean",
                   help="the subscriber's session: persistent (clean session 0) puts its "
                        "TrioMQ queue on disk, so a PUBACK waits for the store")
    t.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    f = sub.add_parser("fanout")
    f.add_argument("--subscribers", type=int, default=1000)
    f.add_argument("--sub-procs", type=int, default=2)
    f.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    f.add_argument("--window", type=int, default=10)
    f.add_argument("--size", type=int, default=64)
    f.add_argument("--duration", type=float, default=10.0)
    f.add_argument("--warmup", type=float, default=2.0)
    f.add_argument("--prefetch", type=int, default=20)
    f.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("connections")
    c.add_argument("--count", type=int, default=10_000)
    for p in (t, f, c):
        p.add_argument("--broker-arg", action="append", default=[])
        p.add_argument("--skip-mosquitto", action="store_true")
        p.add_argument("--triomq-port", type=int, default=None,
                       help="an MQTT port of a TrioMQ already running (not started here)")
    args = parser.parse_args(argv)
    print("$ " + shlex.join([sys.executable, "-m", "bench.mqtt", *(argv or sys.argv[1:])]))
    hard = raise_nofile()
    mqtt_port = free_port()
    extra = ["--mqtt-port", str(mqtt_port), "--http-port", "0", *args.broker_arg]
    if args.cmd in ("throughput", "fanout"):
        extra += ["--mqtt-prefetch", str(args.prefetch)]
    triomq = TrioMQProcess(extra_args=extra, quiet=True)
    if args.triomq_port:
        mqtt_port = args.triomq_port
        triomq.proc = None
    else:
        triomq.start()
        print("TrioMQ:", " ".join(triomq.cmd))
    rows = []
    try:
        if args.cmd == "throughput":
            triomq_pid = triomq.pid or pid_listening_on(mqtt_port)
            mosquitto_pid = pid_listening_on(MOSQUITTO[1])
            for i in range(args.repeats):
                clean = args.session == "clean"
                r = throughput(("127.0.0.1", mqtt_port), args.publishers, args.window,
                               args.size, args.duration, args.warmup, triomq_pid, clean,
                               args.qos)
                print(f"round {i + 1} TrioMQ", r, flush=True)
                m = None
                if not args.skip_mosquitto:
                    m = throughput(MOSQUITTO, args.publishers, args.window, args.size,
                                   args.duration, args.warmup, mosquitto_pid, clean, args.qos)
                    print(f"round {i + 1} Mosquitto", m, flush=True)
                    print(f"round {i + 1} ratio TrioMQ/Mosquitto: "
                          f"{r['msg_per_s'] / m['msg_per_s']:.2f}", flush=True)
                rows.append((r, m))
        elif args.cmd == "fanout":
            triomq_pid = triomq.pid or pid_listening_on(mqtt_port)
            mosquitto_pid = pid_listening_on(MOSQUITTO[1])
            for i in range(args.repeats):
                fan = (args.subscribers, args.sub_procs, args.qos, args.window, args.size,
                       args.duration, args.warmup)
                r = fanout(("127.0.0.1", mqtt_port), *fan, triomq_pid)
                print(f"round {i + 1} TrioMQ", r, flush=True)
                m = None
                if not args.skip_mosquitto:
                    m = fanout(MOSQUITTO, *fan, mosquitto_pid)
                    print(f"round {i + 1} Mosquitto", m, flush=True)
                    print(f"round {i + 1} ratio TrioMQ/Mosquitto: "
                          f"{r['deliveries_per_s'] / max(m['deliveries_per_s'], 1):.2f}",
                          flush=True)
                rows.append((r, m))
        else:
            print(f"open files limit raised to {hard}")
            rows.append((hold_connections(("127.0.0.1", mqtt_port), args.count,
                                          triomq.pid or pid_listening_on(mqtt_port)), None))
    finally:
        triomq.stop()
    if args.cmd == "fanout":
        ratios = sorted(r["deliveries_per_s"] / max(m["deliveries_per_s"], 1)
                        for r, m in rows if m)
        if ratios:
            print(f"ratio TrioMQ/Mosquitto: median {statistics.median(ratios):.2f} "
                  f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f}, {len(ratios)} rounds)")
        return 0
    if args.cmd == "throughput":
        ratios = sorted(r["msg_per_s"] / m["msg_per_s"] for r, m in rows if m)
        if ratios:
            print(f"ratio TrioMQ/Mosquitto: median {statistics.median(ratios):.2f} "
                  f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f}, {len(ratios)} rounds)")
        per_cpu = sorted(r["msg_per_cpu_s"] / m["msg_per_cpu_s"] for r, m in rows
                         if m and r["msg_per_cpu_s"] and m["msg_per_cpu_s"])
        if per_cpu:
            print(f"ratio of msg per CPU-second: median {statistics.median(per_cpu):.2f} "
                  f"(min {per_cpu[0]:.2f}, max {per_cpu[-1]:.2f})")
        return 0
    print("TrioMQ", rows[0][0])
    if not args.skip_mosquitto:
        print("Mosquitto", hold_connections(MOSQUITTO, args.count, pid_listening_on(MOSQUITTO[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
