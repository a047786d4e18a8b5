"""Hostile input at the newer protocol edges: `python -m bench.hostile_edges`.

Starts TrioMQ with a memory limit and the Stream, STOMP, Web-STOMP, MQTT-over-WebSockets
and HTTP listeners, then attacks each with raw sockets (what no client library sends):
declared sizes far past any limit, a header dribbled a byte at a time, thousands of
connections that never log in, commands before login or before a declare, offsets past
the log, compressed sub-entries that inflate (gzip bombs), a super stream of 10,000
partitions, names with NUL, invalid UTF-8 and 64 KiB names. Each attack prints what the
broker answered, the broker's RSS before / peak / after (its connections closed), whether
a bystander (a fresh Stream login + metadata) was answered in time during the attack, and
whether the broker is still alive. Figures and command lines:
docs/performance-limits.md ("Newer protocol edges").
"""
from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.request

from broker.stomp.codec import FrameReader as StompReader
from broker.streamproto import codec as c

from .limits import RssSampler, _settle
from .procinfo import TrioMQProcess, free_port

MiB = 1 << 20


# ---- raw clients ----

class StreamRaw:
    def __init__(self, port: int, timeout: float = 20.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = c.FrameReader(0)
        self.frames: list = []
        self.corr = 100

    def send(self, *cmds) -> None:
        self.sock.sendall(b"".join(x if isinstance(x, bytes) else c.encode(x) for x in cmds))

    def next(self, key: int | None = None, timeout: float = 20.0):
        """The next frame (with ``key``), None when the broker closed the connection."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            while self.frames:
                f = self.frames.pop(0)
                if key is None or f[0] == key:
                    return f
            try:
                data = self.sock.recv(1 << 20)
            except (ConnectionError, OSError):
                return None
            if not data:
                return None
            self.frames += self.reader.feed(data)
        raise TimeoutError(f"no frame {key} in {timeout} s")

    def cid(self) -> int:
        self.corr += 1
        return self.corr

    def request(self, cmd, timeout: float = 60.0) -> int | None:
        """The response code, None when the connection closed instead."""
        self.send(cmd)
        f = self.next(0x8000 | cmd.KEY, timeout)
        if f is None:
            return None
        return struct.unpack_from(">IH", f[2])[1]

    def login(self) -> StreamRaw:
        self.send(c.PeerProperties(1, {}), c.SaslHandshake(2),
                  c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"))
        f = self.next(0x8013)
        assert f is not None and struct.unpack(">IH", f[2]) == (3, c.OK), f
        self.next(c.TUNE)
        self.send(c.Tune(1 << 20, 0))
        self.send(c.Open(4, "/"))
        f = self.next(0x8015)
        assert f is not None and struct.unpack_from(">IH", f[2]) == (4, c.OK), f
        return self

    def closed_with(self, timeout: float = 20.0) -> str:
        """What the broker did next: 'Close(code)' (answered), 'closed' or 'open'."""
        try:
            f = self.next(c.CLOSE, timeout)
        except TimeoutError:
            return "open"
        if f is None:
            return "closed"
        corr, code = struct.unpack_from(">IH", f[2])
        try:
            self.send(c.CloseResponse(corr, c.OK))
        except OSError:
            pass
        return f"Close({code})"

    def close(self) -> None:
        self.sock.close()


def stomp_connect(port: int, login: bool = True, timeout: float = 20.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if login:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
        got = stomp_frames(s, 1)
        assert got and got[0].command == "CONNECTED", got
    return s


def stomp_frames(s: socket.socket, n: int = 1, timeout: float = 20.0) -> list:
    """Up to ``n`` frames (fewer when the broker closes the connection)."""
    reader = StompReader(1 << 24)
    reader.version = "1.2"
    out: list = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        try:
            data = s.recv(65536)
        except (ConnectionError, OSError):
            break
        if not data:
            break
        out += reader.feed(data)
    return out


def stomp_outcome(s: socket.socket) -> str:
    frames = stomp_frames(s, 1)
    if not frames:
        return "closed without ERROR"
    f = frames[0]
    if f.command != "ERROR":
        return f"{f.command} {dict(f.headers)}"
    try:
        s.settimeout(20)
        rest = s.recv(1)
        closed = "then closed" if not rest else "stays open"
    except OSError:
        closed = "then reset"
    return f"ERROR '{f.headers.get('message', '')}' {closed}"


def ws_upgrade(port: int, protocol: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
              f"Sec-WebSocket-Protocol: {protocol}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        piece = s.recv(4096)
        if not piece:
            raise ConnectionError("closed during upgrade")
        head += piece
    assert head.startswith(b"HTTP/1.1 101"), head[:100]
    return s


def ws_frame_head(opcode: int, length: int) -> bytes:
    """A masked client frame head declaring ``length`` octets (64-bit length form)."""
    return bytes((0x80 | opcode, 0x80 | 127)) + struct.pack(">Q", length) + b"\0\0\0\0"


def ws_outcome(s: socket.socket) -> str:
    s.settimeout(20)
    data = b""
    try:
        while True:
            piece = s.recv(4096)
            if not piece:
                break
            data += piece
    except OSError:
        pass
    if len(data) >= 4 and data[0] & 0x0F == 8:
        code = struct.unpack_from(">H", data, 2)[0]
        return f"close frame {code} {data[4:2 + (data[1] & 0x7F)].decode(errors='replace')!r}"
    return "closed without a close frame" if not data else f"got {data[:40]!r}"


def http(port: int, method: str, path: str, body=None, auth=("guest", "guest"),
         raw: bytes | None = None) -> tuple[int, str]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    if auth:
        req.add_header("authorization", "Basic " + base64.b64encode(
            f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(300).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(300).decode(errors="replace")


# ---- the bench ----

class Bench:
    def __init__(self, limit: int):
        self.limit = limit
        self.ports = {k: free_port() for k in ("stream", "stomp", "stomp_ws", "mqtt_ws", "http")}
        self.broker = TrioMQProcess(quiet=True, extra_args=[
            "--memory-limit", str(limit), "--stream-port", str(self.ports["stream"]),
            "--stomp-port", str(self.ports["stomp"]),
            "--stomp-ws-port", str(self.ports["stomp_ws"]),
            "--mqtt-port", str(free_port()), "--mqtt-ws-port", str(self.ports["mqtt_ws"]),
            "--http-port", str(self.ports["http"])]).start()
        self.sampler = RssSampler(self.broker.pid)
        self.sampler.start()
        self.results: list[tuple] = []
        self._wait_port("stream")

    def _wait_port(self, name: str) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", self.ports[name]), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)

    def bystander(self) -> float:
        """Seconds a fresh Stream login and a metadata request take (inf: none in 30 s)."""
        t0 = time.monotonic()
        try:
            cl = StreamRaw(self.ports["stream"], timeout=30).login()
            cl.send(c.Metadata(cl.cid(), ["nope"]))
            cl.next(0x8000 | c.METADATA, 30)
            cl.close()
        except Exception:
            return float("inf")
        return time.monotonic() - t0

    def _pinger(self, stop: threading.Event, worst: list[float]) -> None:
        """A logged-in bystander's metadata round trips all through the attack."""
        try:
            cl = StreamRaw(self.ports["stream"], timeout=120).login()
        except Exception:
            worst[0] = float("inf")
            return
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                cl.send(c.Metadata(cl.cid(), ["nope"]))
                cl.next(0x8000 | c.METADATA, 120)
            except Exception:
                worst[0] = float("inf")
                break
            worst[0] = max(worst[0], time.monotonic() - t0)
            stop.wait(0.1)
        cl.close()

    def run(self, name: str, attack, *args) -> None:
        base = _settle(self.sampler, 0.5)
        self.sampler.reset()
        stop, worst = threading.Event(), [0.0]
        pinger = threading.Thread(target=self._pinger, args=(stop, worst), daemon=True)
        pinger.start()
        t0 = time.monotonic()
        try:
            outcome, conns = attack(self, *args)
        except Exception as exc:
            outcome, conns = f"attack failed: {type(exc).__name__}: {exc}", []
        elapsed = time.monotonic() - t0
        stop.set()
        pinger.join(130)
        by = max(self.bystander(), worst[0])
        peak = self.sampler.peak
        for s in conns:
            s.close()
        after = _settle(self.sampler, 3.0)
        alive = self.broker.proc.poll() is None
        ok = alive and peak <= 1.1 * self.limit and by < 5
        self.results.append((name, outcome, base, peak, after, by, alive, ok))
        print(f"{'ok ' if ok else 'BAD'} {name}: {outcome} | RSS {base / MiB:.0f} -> peak "
              f"{peak / MiB:.0f} -> after {after / MiB:.0f} MiB | {elapsed:.1f} s | bystander's "
              f"worst round trip {by:.2f} s | {'alive' if alive else 'DEAD'}", flush=True)
        if not alive:
            print(self.broker.log_tail(40))
            raise SystemExit(1)

    def stop(self) -> None:
        self.sampler.stop_event.set()
        try:  # kept for a look at what the broker logged
            shutil.copy(self.broker.log_path, "/tmp/hostile_edges_broker.log")
        except OSError:
            pass
        self.broker.stop()


# ---- Stream protocol ----

def s_prelogin_huge(b: Bench):
    s = StreamRaw(b.ports["stream"])
    s.send(struct.pack(">I", 1 << 31) + struct.pack(">HH", c.PEER_PROPERTIES, 1) + b"x" * 100)
    return s.closed_with(), [s]


def s_open_huge(b: Bench):
    s = StreamRaw(b.ports["stream"]).login()
    s.send(struct.pack(">I", (1 << 31) - 1) + struct.pack(">HH", c.PUBLISH, 1) + b"x" * 4096)
    return s.closed_with(), [s]


def s_slowloris(b: Bench, after_login: bool):
    s = StreamRaw(b.ports["stream"])
    if after_login:
        s.login()
    frame = c.encode(c.PeerProperties(1, {"k": "v" * 100})) if not after_login \
        else c.encode(c.Metadata(9, ["x" * 200]))
    t0 = time.monotonic()
    s.sock.settimeout(1.0)
    sent = 0
    for byte in frame[:-1]:
        try:
            s.sock.sendall(bytes((byte,)))
            sent += 1
        except OSError:
            break
        try:
            if s.sock.recv(1 << 16) == b"":
                break
        except TimeoutError:
            pass
        except OSError:
            break
        if time.monotonic() - t0 > 25:
            break
    return f"{sent} bytes at 1/s, connection ended after {time.monotonic() - t0:.0f} s", [s]


def s_many_unauth(b: Bench, n: int):
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", b.ports["stream"]), timeout=10)
            s.sendall(c.encode(c.PeerProperties(1, {"k": "v" * 1000}))[:-10])
            socks.append(s)
        except OSError as exc:
            return f"{len(socks)} open, then {exc}", socks
    time.sleep(2)
    return f"{len(socks)} half-sent PeerProperties held open", socks


def s_publish_undeclared(b: Bench):
    s = StreamRaw(b.ports["stream"]).login()
    s.send(c.Publish(7, [c.PublishedMessage(1, b"m")]))
    f = s.next(c.PUBLISH_ERROR, 20)
    code = "none" if f is None else struct.unpack_from(">BIQH", f[2])[3]
    return f"PublishError code {code}", [s]


def s_offsets(b: Bench):
    s = StreamRaw(b.ports["stream"]).login()
    name = f"hostile-off-{os.getpid()}"
    out = [f"create {s.request(c.Create(s.cid(), name, {}))}"]
    for i, spec in enumerate([(c.OFFSET_OFFSET, (1 << 64) - 1), (c.OFFSET_TIMESTAMP, -1),
                              (c.OFFSET_TIMESTAMP, -(1 << 63))]):
        code = s.request(c.Subscribe(s.cid(), i + 1, name, spec, 65535, {}))
        out.append(f"{spec[0]}/{spec[1]}: {code}")
    s.send(c.Credit(1, 65535), c.Credit(1, 65535), c.Credit(200, 1))
    f = s.next(0x8000 | c.CREDIT, 10)
    out.append(f"credit unknown sub: {None if f is None else struct.unpack_from('>H', f[2])[0]}")
    s.request(c.Delete(s.cid(), name))
    s.send(c.Subscribe(s.cid(), 9, name, (99, 0), 1, {}))  # an unknown offset type
    out.append(f"offset type 99: {s.closed_with()}")
    return "; ".join(out), [s]


def _bomb(size: int) -> c.SubEntry:
    raw = struct.pack(">I", size - 4) + bytes(size - 4)
    return c.SubEntry(c.COMPRESSION_GZIP, 1, size, gzip.compress(raw, 9))


def s_gzip_bomb(b: Bench, batches: int, size: int, frames: bool = False):
    s = StreamRaw(b.ports["stream"]).login()
    name = f"hostile-bomb-{os.getpid()}"
    s.request(c.Create(s.cid(), name, {}))
    s.request(c.DeclarePublisher(s.cid(), 1, "", name))
    bomb = _bomb(size)
    if frames:  # one bomb a frame, back to back
        frame = b"".join(c.encode(c.Publish(1, [c.PublishedMessage(i, bomb)]))
                         for i in range(batches))
    else:
        frame = c.encode(c.Publish(1, [c.PublishedMessage(i, bomb) for i in range(batches)]))
    s.send(frame)
    codes: dict = {}
    got = 0
    end = time.monotonic() + 120
    while got < batches and time.monotonic() < end:
        f = s.next(None, 120)
        if f is None:
            break
        if f[0] == c.PUBLISH_CONFIRM:
            n = struct.unpack_from(">BI", f[2])[1]
            codes["confirmed"] = codes.get("confirmed", 0) + n
            got += n
        elif f[0] == c.PUBLISH_ERROR:
            n = struct.unpack_from(">BI", f[2])[1]
            code = struct.unpack_from(">BIQH", f[2])[3]
            codes[f"error {code}"] = codes.get(f"error {code}", 0) + n
            got += n
    s.request(c.Delete(s.cid(), name))
    return (f"{batches} gzip batches of {size / MiB:.0f} MiB each in {len(frame):,} octets "
            f"({'a frame each' if frames else 'one frame'}): {codes}"), [s]


def s_super_stream(b: Bench, n: int):
    s = StreamRaw(b.ports["stream"]).login()
    name = f"hostile-super-{os.getpid()}"
    parts = [f"{name}-{i}" for i in range(n)]
    code = s.request(c.CreateSuperStream(s.cid(), name, parts, [str(i) for i in range(n)], {}),
                     timeout=300)
    if code == c.OK:
        s.request(c.DeleteSuperStream(s.cid(), name), timeout=300)
    return f"CreateSuperStream of {n} partitions: {code}", [s]


def s_names(b: Bench):
    s = StreamRaw(b.ports["stream"]).login()
    out = []
    for label, value in [("argument '²'", "²"), ("argument of 5000 digits", "9" * 5000)]:
        code = s.request(c.Create(s.cid(), f"hostile-arg-{os.getpid()}",
                                  {"max-length-bytes": value}))
        out.append(f"{label}: {code}")
        if code == c.OK:
            s.request(c.Delete(s.cid(), f"hostile-arg-{os.getpid()}"))
    for label, raw in [("NUL", b"a\0b"), ("32 KiB", b"n" * 32767),
                       ("invalid UTF-8", b"a\xff\xfeb")]:
        frame = struct.pack(">HHI", c.CREATE, 1, 77) + struct.pack(">H", len(raw)) + raw \
            + struct.pack(">i", 0)
        s.send(struct.pack(">I", len(frame)) + frame)
        try:
            f = s.next(None, 20)
        except TimeoutError:
            f = None
        if f is None or f[0] == c.CLOSE:
            what = s.closed_with() if f is None else f"Close({struct.unpack_from('>IH', f[2])[1]})"
            out.append(f"{label}: {what}")
            return "; ".join(out), [s]
        out.append(f"{label}: {struct.unpack_from('>IH', f[2])[1]}")
    return "; ".join(out), [s]


# ---- STOMP ----

def t_content_length(b: Bench):
    s = stomp_connect(b.ports["stomp"])
    s.sendall(b"SEND\ndestination:/queue/hostile\ncontent-length:2000000000\n\nxxxx")
    return stomp_outcome(s), [s]


def t_prelogin_send(b: Bench):
    s = stomp_connect(b.ports["stomp"], login=False)
    s.sendall(b"SEND\ndestination:/queue/hostile\n\nhello\x00")
    return stomp_outcome(s), [s]


def t_headers(b: Bench, n: int, size: int):
    s = stomp_connect(b.ports["stomp"])
    head = b"SEND\ndestination:/queue/hostile-h\n" + b"".join(
        b"h%d:%s\n" % (i, b"v" * size) for i in range(n))
    try:
        s.sendall(head + b"\nbody\x00")
    except OSError:
        pass
    return f"{n} headers of {size} octets: " + stomp_outcome(s), [s]


def t_line(b: Bench):
    s = stomp_connect(b.ports["stomp"])
    try:
        s.sendall(b"SEND\ndestination:/queue/x\nh:" + b"v" * (4 * MiB))
    except OSError:
        pass
    return "a 4 MiB header line: " + stomp_outcome(s), [s]


def t_slowloris(b: Bench):
    s = stomp_connect(b.ports["stomp"], login=False)
    s.settimeout(1.0)
    t0 = time.monotonic()
    sent = 0
    for byte in b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest" + b"x" * 100:
        try:
            s.sendall(bytes((byte,)))
            sent += 1
            if s.recv(4096) == b"":
                break
        except TimeoutError:
            pass
        except OSError:
            break
        if time.monotonic() - t0 > 25:
            break
    return f"{sent} CONNECT octets at 1/s, connection ended after {time.monotonic() - t0:.0f} s", [s]


def t_many_unauth(b: Bench, n: int):
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=10)
            s.sendall(b"CONNECT\naccept-version:1.2\nh:" + b"v" * 1000)
            socks.append(s)
        except OSError as exc:
            return f"{len(socks)} open, then {exc}", socks
    time.sleep(2)
    return f"{len(socks)} half-sent CONNECTs held open", socks


def t_names(b: Bench):
    out = []
    for label, dest in [("invalid UTF-8", b"/queue/a\xff\xfeb"), ("64 KiB", b"/queue/" + b"n" * 65000),
                        ("amq.", b"/amq/queue/amq.x")]:
        s = stomp_connect(b.ports["stomp"])
        s.sendall(b"SEND\ndestination:" + dest + b"\nreceipt:r1\n\nbody\x00")
        out.append(f"{label}: {stomp_outcome(s)}")
        s.close()
    s = stomp_connect(b.ports["stomp"])
    s.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/hostile-sub\nreceipt:r2\nprefetch-count:-5\n"
              b"x-stream-offset:-99999999999999999999\n\n\x00")
    out.append(f"negative prefetch/offset: {stomp_outcome(s)}")
    return "; ".join(out), [s]


# ---- WebSockets ----

def w_huge(b: Bench, port: str, protocol: str):
    s = ws_upgrade(b.ports[port], protocol)
    s.sendall(ws_frame_head(2, (1 << 63) - 1) + b"x" * 4096)
    return ws_outcome(s), [s]


def w_fragments(b: Bench, port: str, protocol: str, total: int):
    """A message in 64 KiB fragments that never ends."""
    s = ws_upgrade(b.ports[port], protocol)
    sent = 0
    first = True
    try:
        while sent < total:
            payload = b"x" * 65536
            head = bytes((2 if first else 0, 0x80 | 127)) + struct.pack(">Q", len(payload)) \
                + b"\0\0\0\0"
            first = False
            s.sendall(head + payload)
            sent += len(payload)
    except OSError:
        pass
    return f"{sent / MiB:.0f} MiB of fragments: " + ws_outcome(s), [s]


def w_slow_upgrade(b: Bench, port: str):
    s = socket.create_connection(("127.0.0.1", b.ports[port]), timeout=1)
    t0 = time.monotonic()
    for byte in b"GET /ws HTTP/1.1\r\nHost: x\r\nX-Long: " + b"y" * 200:
        try:
            s.sendall(bytes((byte,)))
            if s.recv(4096) == b"":
                break
        except TimeoutError:
            pass
        except OSError:
            break
        if time.monotonic() - t0 > 25:
            break
    return f"upgrade dribbled, connection ended after {time.monotonic() - t0:.0f} s", [s]


# ---- HTTP ----

def h_super(b: Bench, body: dict):
    code, text = http(b.ports["http"], "PUT", "/api/stream/super-streams/%2F/hostile-ss", body)
    if code < 300:
        http(b.ports["http"], "DELETE", "/api/stream/super-streams/%2F/hostile-ss")
    return f"PUT super stream {json.dumps(body)[:60]}: {code} {text[:100]!r}", []


def h_names(b: Bench):
    out = []
    for label, path in [("NUL", "/api/queues/%2F/a%00b"), ("invalid UTF-8", "/api/queues/%2F/a%FFb"),
                        ("300 bytes", "/api/queues/%2F/" + "n" * 300),
                        ("64 KiB", "/api/queues/%2F/" + "n" * 65536)]:
        try:
            code, text = http(b.ports["http"], "PUT", path, {"durable": True})
        except Exception as exc:
            code, text = 0, str(exc)
        out.append(f"{label}: {code} {text[:80]!r}")
    for body in [{"partitions": 3, "arguments": {"x": "a\0b"}}]:
        code, text = http(b.ports["http"], "PUT", "/api/stream/super-streams/%2F/a%00b", body)
        out.append(f"super NUL: {code} {text[:80]!r}")
    return "; ".join(out), []


def h_auth(b: Bench):
    out = []
    for path, raw in [("/api/auth", None), ("/api/login", b"{" * 100000),
                      ("/api/oauth2/token", b"x" * (8 * MiB))]:
        try:
            code, text = http(b.ports["http"], "POST" if raw else "GET", path, raw=raw, auth=None)
        except Exception as exc:
            code, text = 0, str(exc)
        out.append(f"{path}: {code} {text[:60]!r}")
    return "; ".join(out), []


ATTACKS = {
    "stream-prelogin-2^31": (s_prelogin_huge,),
    "stream-open-2^31": (s_open_huge,),
    "stream-slowloris-prelogin": (s_slowloris, False),
    "stream-slowloris-open": (s_slowloris, True),
    "stream-2000-unauth": (s_many_unauth, 2000),
    "stream-publish-undeclared": (s_publish_undeclared,),
    "stream-offsets-credit": (s_offsets,),
    "stream-gzip-bomb": (s_gzip_bomb, 8, 128 * MiB - 64),
    "stream-gzip-bombs": (s_gzip_bomb, 16, 128 * MiB - 64, True),
    "stream-names": (s_names,),
    "stream-super-1000": (s_super_stream, 1000),
    "stream-super-10000": (s_super_stream, 10000),
    "stomp-content-length-2G": (t_content_length,),
    "stomp-prelogin-send": (t_prelogin_send,),
    "stomp-10000-headers": (t_headers, 10000, 10),
    "stomp-1000-headers-60B": (t_headers, 1000, 60),
    "stomp-4MiB-line": (t_line,),
    "stomp-slowloris": (t_slowloris,),
    "stomp-2000-unauth": (t_many_unauth, 2000),
    "stomp-names": (t_names,),
    "mqtt-ws-2^63": (w_huge, "mqtt_ws", "mqtt"),
    "stomp-ws-2^63": (w_huge, "stomp_ws", "v12.stomp"),
    "mqtt-ws-fragments": (w_fragments, "mqtt_ws", "mqtt", 300 * MiB),
    "stomp-ws-fragments": (w_fragments, "stomp_ws", "v12.stomp", 300 * MiB),
    "mqtt-ws-slow-upgrade": (w_slow_upgrade, "mqtt_ws"),
    "http-super-10000": (h_super, {"partitions": 10000}),
    "http-super-10^9": (h_super, {"partitions": 10 ** 9}),
    "http-names": (h_names,),
    "http-auth": (h_auth,),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostile_edges",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--memory-limit-mib", type=int, default=256)
    p.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(ATTACKS)
    b = Bench(a.memory_limit_mib * MiB)
    try:
        time.sleep(1.0)
        print(f"TrioMQ pid {b.broker.pid}, memory limit {a.memory_limit_mib} MiB, ports {b.ports}")
        for name in names:
            fn, *args = ATTACKS[name]
            b.run(name, fn, *args)
    finally:
        b.stop()
    bad = [r[0] for r in b.results if not r[-1]]
    print("all within bounds" if not bad else f"OUT OF BOUNDS: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
