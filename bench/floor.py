"""The floor of a one-core CPython AMQP broker on this machine: the least work per message
that any Python design must do on the 1p/1c transient path, measured without a broker.

    python -m bench.floor [--messages 200000] [--size 64]

Per message, in a loop over pre-encoded client frames (what `bench run` sends): split the
three frames of a basic.publish (method, content header, body) with ``struct``, read the
exchange and routing key, look the route up in a dict, append to and pop from a deque (a
queue), build the three frames of a basic.deliver, and join a batch of them into one output
buffer. Then the kernel's part: the same bytes through a socketpair, in and out, in 64 KiB
reads and writes. No validation, no flow control, no consumer choice, no counters, no event
objects: a lower bound, not a design. The sum is the CPU a single-core Python broker cannot
go below; 1e6 / that is its message rate with a whole core and nothing else to do.
"""
from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time
from collections import deque

_FRAME = struct.Struct(">BHI")
_HDR = struct.Struct(">HHQ")
_DELIVER_HEAD = struct.Struct(">BHIHH")


def _publish(channel: int, exchange: bytes, key: bytes, body: bytes) -> bytes:
    method = struct.pack(">HHH", 60, 40, 0) + bytes([len(exchange)]) + exchange + \
        bytes([len(key)]) + key + b"\x00"
    header = _HDR.pack(60, 0, len(body)) + b"\x10\x00\x01"  # delivery-mode 1
    return b"".join(_FRAME.pack(t, channel, len(p)) + p + b"\xce"
                    for t, p in ((1, method), (2, header), (3, body)))


def python_floor(messages: int, size: int) -> float:
    """Seconds of CPU per message for the parse / route / queue / encode loop."""
    one = _publish(1, b"bench", b"q", b"x" * size)
    batch = 200
    data = one * batch
    routes = {(b"bench", b"q"): deque()}
    unpack, pack = _FRAME.unpack_from, struct.pack
    tag = 0
    t0 = time.process_time()
    for _ in range(messages // batch):
        mv = memoryview(data)
        pos, end = 0, len(data)
        out = []
        while pos < end:
            _, ch, n = unpack(mv, pos)  # method
            m = pos + 7
            xl = data[m + 6]
            exchange = data[m + 7:m + 7 + xl]
            kl = data[m + 7 + xl]
            key = data[m + 8 + xl:m + 8 + xl + kl]
            pos = m + n + 1
            _, _, n = unpack(mv, pos)  # content header
            props = data[pos + 19:pos + 7 + n]
            pos += 7 + n + 1
            _, _, n = unpack(mv, pos)  # body
            body = data[pos + 7:pos + 7 + n]
            pos += 7 + n + 1
            q = routes[(exchange, key)]
            q.append((exchange, key, props, body))
            exchange, key, props, body = q.popleft()
            tag += 1
            args = pack(">B", 4) + b"ctag" + pack(">QB", tag, 0) + bytes([len(exchange)]) + \
                exchange + bytes([len(key)]) + key
            out.append(_DELIVER_HEAD.pack(1, ch, len(args) + 4, 60, 60) + args + b"\xce")
            hdr = _HDR.pack(60, 0, len(body)) + props
            out.append(_FRAME.pack(2, ch, len(hdr)) + hdr + b"\xce")
            out.append(_FRAME.pack(3, ch, len(body)) + body + b"\xce")
        b"".join(out)
    return (time.process_time() - t0) / messages


def kernel_floor(messages: int, size: int) -> float:
    """Seconds of this thread's CPU per message to receive a publish's bytes and send a
    delivery's (about the same size) over loopback-like sockets, 64 KiB per call."""
    per_msg = len(_publish(1, b"bench", b"q", b"x" * size))
    total = per_msg * messages
    chunk = b"\0" * 65536
    a, b = socket.socketpair()
    c, d = socket.socketpair()

    def feed() -> None:  # the publisher's side (another thread: its CPU is not counted)
        left = total
        while left > 0:
            left -= a.send(chunk[:min(left, 65536)])

    def drain() -> None:  # the consumer's side
        left = total
        while left > 0:
            left -= len(d.recv(65536))

    threads = [threading.Thread(target=feed), threading.Thread(target=drain)]
    for t in threads:
        t.start()
    buf = bytearray(65536)
    got = 0
    t0 = time.thread_time()
    while got < total:
        n = b.recv_into(buf)
        got += n
        c.sendall(memoryview(buf)[:n])
    spent = time.thread_time() - t0
    for t in threads:
        t.join()
    for s in (a, b, c, d):
        s.close()
    return spent / messages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5, help="runs; the minimum is reported")
    args = p.parse_args(argv)
    py = min(python_floor(args.messages, args.size) for _ in range(args.repeat))
    kernel = min(kernel_floor(args.messages, args.size) for _ in range(args.repeat))
    total = py + kernel
    print(f"python loop (parse, route, queue, encode): {py * 1e6:.2f} µs/msg")
    print(f"kernel (recv + send, 64 KiB calls):        {kernel * 1e6:.2f} µs/msg")
    print(f"floor:                                     {total * 1e6:.2f} µs/msg = "
          f"{1 / total:,.0f} msg/s on one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
