"""Memory bounds under hostile input: `python -m bench.limits`.

Starts TrioMQ with a memory limit and runs three probes against it, sampling the broker's
RSS (/proc) all along:

* ``declared``: connections whose channels each send a basic.publish and a content header
  declaring the largest accepted body, then one body octet, and stay open (the issue's
  "888 bytes grew the broker by 1.5 GB").
* ``fuzz``: raw-frame fuzzing for a while: connections that handshake, open channels and
  send random frames (headers declaring random sizes, body frames, random bytes),
  reconnecting when the broker closes them.
* ``alarm``: with the memory alarm on from the start (a limit below the broker's own
  RSS), a publisher that published once keeps writing: how many of its messages the
  broker read (RabbitMQ: none).

Each probe prints the RSS before, its peak, and after its connections closed (the broker
gives freed heap back within a few seconds), against the limit + 10 %. Figures and
command lines: docs/performance-limits.md.
"""
from __future__ import annotations

import argparse
import random
import struct
import sys
import threading
import time

from rawamqp.client import RawAMQP
from rawamqp.codec import BASIC_PUBLISH, content_header, method_frame, shortstr

from .procinfo import TrioMQProcess, rss_kb

MiB = 1 << 20
MAX_MESSAGE = 128 * MiB  # the broker's default max_message_size


class RssSampler(threading.Thread):
    """Samples the broker's RSS every ``interval`` seconds; ``peak`` since ``reset``."""

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = self.last = 0
        self.stop_event = threading.Event()

    def reset(self) -> None:
        self.peak = self.last

    def run(self) -> None:
        while not self.stop_event.is_set():
            kb = rss_kb(self.pid) or 0
            self.last = kb * 1024
            self.peak = max(self.peak, self.last)
            time.sleep(self.interval)


def _publish_head(ch: int, size: int, exchange: str = "") -> bytes:
    return method_frame(ch, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr(exchange)
                        + shortstr("k") + b"\x00") + content_header(ch, size)


def _frame(ftype: int, ch: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, ch, len(payload)) + payload + b"\xce"


def _connect(port: int, channels: int) -> RawAMQP:
    c = RawAMQP("127.0.0.1", port, timeout=30).handshake()
    for ch in range(1, channels + 1):
        c.channel_open(ch)
    return c


def probe_declared(port: int, connections: int, channels: int) -> tuple[list[RawAMQP], int]:
    """Every channel declares a MAX_MESSAGE body and sends one octet of it; returns the
    connections (left open) and the octets sent after the handshakes."""
    conns, sent = [], 0
    for _ in range(connections):
        c = _connect(port, channels)
        data = b"".join(_publish_head(ch, MAX_MESSAGE) + _frame(3, ch, b"x")
                        for ch in range(1, channels + 1))
        c.send(data)
        sent += len(data)
        conns.append(c)
    return conns, sent


def _fuzz_frames(rng: random.Random, channels: int) -> bytes:
    out = []
    for _ in range(rng.randint(1, 20)):
        ch = rng.randint(1, channels)
        kind = rng.random()
        if kind < 0.3:
            out.append(_publish_head(ch, rng.choice(
                [rng.randint(0, 1 << 16), rng.randint(0, MAX_MESSAGE), MAX_MESSAGE,
                 rng.randint(0, (1 << 64) - 1)])))
        elif kind < 0.6:
            out.append(_frame(3, ch, rng.randbytes(rng.choice([1, 100, 4096, 65536]))))
        elif kind < 0.7:
            # a frame head declaring a large frame, then a little of it
            out.append(struct.pack(">BHI", rng.choice([1, 2, 3]), ch, rng.randint(0, 1 << 17))
                       + rng.randbytes(rng.randint(0, 64)))
        elif kind < 0.8:
            out.append(_frame(rng.choice([1, 2, 3, 8, 4, 0]), ch, rng.randbytes(rng.randint(0, 300))))
        else:
            out.append(rng.randbytes(rng.randint(1, 2000)))
    return b"".join(out)


def probe_fuzz(port: int, seconds: float, workers: int, channels: int, seed: int) -> int:
    """Raw-frame fuzzing from ``workers`` threads for ``seconds``; returns octets sent."""
    sent = [0] * workers
    deadline = time.monotonic() + seconds

    def work(i: int) -> None:
        rng = random.Random(seed + i)
        conns: list[RawAMQP] = []
        while time.monotonic() < deadline:
            try:
                if len(conns) < 4:
                    conns.append(_connect(port, channels))
                c = rng.choice(conns)
                data = _fuzz_frames(rng, channels)
                c.sock.settimeout(1.0)
                c.send(data)
                sent[i] += len(data)
            except Exception:  # closed by the broker (or refused): a new connection
                for c in conns:
                    if c.sock.fileno() == -1:
                        conns.remove(c)
                        break
                else:
                    if conns:
                        conns.pop(0).close()
        for c in conns:
            c.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return sum(sent)


def probe_alarm(port: int, seconds: float) -> tuple[int, int]:
    """With the memory alarm holding: a publisher publishes once (read: it is not yet a
    publisher), then writes 1 KiB messages for ``seconds``. Returns (octets the client's
    kernel took, messages in the queue afterwards, as a fresh connection sees them)."""
    queue = f"limits-alarm-{random.getrandbits(32):08x}"
    c = _connect(port, 1)
    c.queue_declare(1, queue, auto_delete=False)
    msg = method_frame(1, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("") + shortstr(queue)
                       + b"\x00") + content_header(1, 1024) + _frame(3, 1, b"m" * 1024)
    c.send(msg)
    time.sleep(1.0)  # the first publish is read, the connection is now a blocked publisher
    c.sock.setblocking(False)
    taken = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            taken += c.sock.send(msg)
        except BlockingIOError:
            time.sleep(0.05)
    probe = _connect(port, 1)  # never publishes: read under the alarm
    _name, count, _consumers = probe.queue_declare(1, queue, passive=True)
    probe.close()
    c.close()
    return taken, count


def _mb(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def _settle(sampler: RssSampler, seconds: float) -> int:
    """The lowest RSS seen over ``seconds`` (freed heap is trimmed by the 1 s monitor)."""
    low = sampler.last
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.1)
        low = min(low, sampler.last)
    return low


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__.split("\n\n")[0])
    p.add_argument("--memory-limit-mib", type=int, default=256)
    p.add_argument("--probes", default="declared,fuzz,alarm")
    p.add_argument("--connections", type=int, default=4, help="declared: connections")
    p.add_argument("--channels", type=int, default=100, help="channels per connection")
    p.add_argument("--fuzz-seconds", type=float, default=60.0)
    p.add_argument("--fuzz-workers", type=int, default=4)
    p.add_argument("--alarm-seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    limit = a.memory_limit_mib * MiB
    probes = a.probes.split(",")
    ok = True
    if set(probes) & {"declared", "fuzz"}:
        broker = TrioMQProcess(extra_args=["--memory-limit", str(limit)], quiet=True).start()
        sampler = RssSampler(broker.pid)
        sampler.start()
        try:
            time.sleep(1.0)
            base = _settle(sampler, 1.0)
            print(f"TrioMQ pid {broker.pid}, memory limit {_mb(limit)}, RSS at rest {_mb(base)}")
            if "declared" in probes:
                sampler.reset()
                conns, sent = probe_declared(broker.port, a.connections, a.channels)
                time.sleep(3.0)
                held = sampler.last
                peak = sampler.peak
                for c in conns:
                    c.close()
                after = _settle(sampler, 5.0)
                declared = a.connections * a.channels * MAX_MESSAGE
                print(f"declared: {a.connections} connections x {a.channels} channels declared "
                      f"{declared / (1 << 30):,.0f} GiB of bodies with {sent:,} octets: RSS "
                      f"peak {_mb(peak)}, held {_mb(held)}, after close {_mb(after)}")
                ok &= peak <= 1.1 * limit
            if "fuzz" in probes:
                sampler.reset()
                sent = probe_fuzz(broker.port, a.fuzz_seconds, a.fuzz_workers, a.channels // 10
                                  or 1, a.seed)
                peak = sampler.peak
                after = _settle(sampler, 5.0)
                print(f"fuzz: {a.fuzz_workers} workers x {a.fuzz_seconds:.0f} s, {sent / MiB:,.0f} "
                      f"MiB of random frames: RSS peak {_mb(peak)}, after close {_mb(after)}")
                ok &= peak <= 1.1 * limit
        finally:
            sampler.stop_event.set()
            broker.stop()
    if "alarm" in probes:
        # a limit below the broker's own RSS: the memory alarm holds from the start
        broker = TrioMQProcess(extra_args=["--memory-limit", str(1 * MiB)], quiet=True).start()
        try:
            time.sleep(1.5)  # the resource monitor's first check raises the alarm
            taken, count = probe_alarm(broker.port, a.alarm_seconds)
            print(f"alarm: a blocked publisher wrote for {a.alarm_seconds:.0f} s, its kernel took "
                  f"{taken:,} octets; messages the broker read: {count} (the first, before the "
                  f"connection was a publisher)")
            ok &= count <= 1
        finally:
            broker.stop()
    print("within bounds" if ok else "OUT OF BOUNDS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
