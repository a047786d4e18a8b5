"""Scale-of-entities measurements for `python -m bench matrix`: many idle connections,
many queues, many consumers on one queue. Each runs in this process over rawamqp
connections, names everything `bench-<pid>-<time>-…` and deletes what it created, also
when it fails or is interrupted."""
from __future__ import annotations

import os
import resource
import select
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import rawamqp as ra

from . import procinfo

_DELIVER_TAG = struct.Struct(">Q").unpack_from


def _run_id() -> str:
    return f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the new soft limit. A TrioMQ
    started afterwards inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def _rss(pid):
    return procinfo.rss_kb(pid) if pid else None


def _per(delta_kb, n):
    return None if delta_kb is None or not n else delta_kb / n


def _pipeline(conn: ra.Connection, ch: int, frames: list[bytes], expect, window: int = 500,
              timeout: float = 600.0):
    """Send `frames` (methods on `ch` that each get one `expect` reply), `window` in flight."""
    sent = done = 0
    deadline = time.monotonic() + timeout
    while done < len(frames):
        if sent < len(frames) and sent - done < window:
            n = min(len(frames) - sent, window - (sent - done))
            conn.send(b"".join(frames[sent:sent + n]))
            sent += n
        conn.wait(ch, expect, max(0.001, deadline - time.monotonic()))
        done += 1


def _declare_frame(name: str) -> bytes:
    return ra.method_frame(1, 50, 10, b"\x00\x00" + ra.shortstr(name) + ra.bits(False, False, False,
                                                                                 False, False)
                           + ra.table(None))


def _delete_frame(name: str) -> bytes:
    return ra.method_frame(1, 50, 40, b"\x00\x00" + ra.shortstr(name) + ra.bits(False, False, False))


def delete_queues(url: str, names: list[str], log=print):
    """Delete `names` (pipelined); a missing queue is fine on RabbitMQ 3.x and TrioMQ."""
    if not names:
        return
    try:
        c = ra.Connection(url, timeout=60.0)
    except Exception as e:
        log(f"WARNING: cleanup could not connect: {e}")
        return
    try:
        c.channel_open(1)
        _pipeline(c, 1, [_delete_frame(q) for q in names], ra.QUEUE_DELETE_OK)
    except Exception as e:
        log(f"WARNING: deleting {len(names)} queues failed: {type(e).__name__}: {e}")
    finally:
        c.close()


_CLOSE = ra.method_frame(0, 10, 50, struct.pack(">H", 200) + ra.shortstr("bye") + struct.pack(">HH", 0, 0))


def _close(c: ra.Connection, timeout: float = 10.0):
    """connection.close, then read until the broker closes the socket (no select(): the
    descriptors of thousands of connections are above FD_SETSIZE)."""
    if c.closed:
        return
    c.closed = True
    try:
        c.sock.settimeout(timeout)
        c.send(_CLOSE)
        seen = bytes(c.buf)
        while b"\x00\x0a\x00\x33" not in seen:   # connection.close-ok (10, 51), or EOF
            data = c.sock.recv(1 << 16)
            if not data:
                break
            seen = seen[-3:] + data
    except OSError:
        pass
    finally:
        c.sock.close()


def _close_all(conns, workers=16):
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(_close, conns))


def fd_limit_of(pid: int | None) -> int | None:
    """The soft open-files limit of a process (from /proc/PID/limits), None if unreadable."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    v = line.split()[3]
                    return None if v == "unlimited" else int(v)
    except (OSError, ValueError, IndexError):
        pass
    return None


# ----------------------------------------------------------------------------
# rows
# ----------------------------------------------------------------------------

def idle_connections(url: str, n: int, broker_pid: int | None, workers: int = 16) -> dict:
    """`n` connections, each with one channel and one no-ack consumer on a shared queue.
    `n` is capped at 80 % of the broker's open-files limit (RabbitMQ refuses sockets beyond
    its file-handle budget; its limit is left as it is)."""
    limit = fd_limit_of(broker_pid)
    asked = n
    if limit:
        n = min(n, int(limit * 0.8))
    q = f"bench-{_run_id()}-idle"
    setup = ra.Connection(url, timeout=30.0)
    conns: list[ra.Connection] = []
    lock = threading.Lock()
    out: dict = {"connections": n, "connections_asked": asked, "broker_fd_limit": limit}
    try:
        setup.channel_open(1)
        setup.queue_declare(1, q)
        time.sleep(0.5)
        rss0 = _rss(broker_pid)

        def one(i):
            c = ra.Connection(url, timeout=30.0)
            with lock:
                conns.append(c)
            c.channel_open(1)
            c.basic_consume(1, q, tag=f"idle-{i}", no_ack=True)

        t = time.monotonic()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, range(n)))
        dt = time.monotonic() - t
        time.sleep(1.0)
        rss1 = _rss(broker_pid)
        out.update(open_rate=n / dt, open_seconds=dt,
                   rss_before_mb=None if rss0 is None else rss0 / 1024,
                   rss_after_mb=None if rss1 is None else rss1 / 1024,
                   rss_per_conn_kb=_per(None if rss0 is None or rss1 is None else rss1 - rss0, n))
        return out
    finally:
        t = time.monotonic()
        try:
            _close_all(conns, workers)
            out["close_seconds"] = time.monotonic() - t
        finally:
            try:
                setup.queue_delete(1, q, timeout=60.0)
            finally:
                _close(setup)


def many_queues(url: str, n: int, broker_pid: int | None, log=print) -> dict:
    """Declare `n` queues (pipelined): declare rate, RSS per queue; then delete them all."""
    run = _run_id()
    names = [f"bench-{run}-mq{i}" for i in range(n)]
    c = ra.Connection(url, timeout=60.0)
    try:
        c.channel_open(1)
        time.sleep(0.5)
        rss0 = _rss(broker_pid)
        frames = [_declare_frame(q) for q in names]
        t = time.monotonic()
        _pipeline(c, 1, frames, ra.QUEUE_DECLARE_OK)
        dt = time.monotonic() - t
        time.sleep(1.0)
        rss1 = _rss(broker_pid)
    finally:
        c.close()
        t = time.monotonic()
        delete_queues(url, names, log)
        del_s = time.monotonic() - t
    return {"queues": n, "declare_rate": n / dt, "declare_seconds": dt, "delete_rate": n / del_s,
            "rss_before_mb": None if rss0 is None else rss0 / 1024,
            "rss_after_mb": None if rss1 is None else rss1 / 1024,
            "rss_per_queue_kb": _per(None if rss0 is None or rss1 is None else rss1 - rss0, n)}


def many_consumers(url: str, n: int, duration: float, warmup: float, per_conn: int = 100,
                   size: int = 64, max_backlog: int = 2000) -> dict:
    """`n` consumers (prefetch 1, manual ack, `per_conn` channels per connection) on one queue,
    fed by a producer thread that keeps at most `max_backlog` messages outstanding.
    Throughput and round-robin fairness: deliveries per consumer in the measured window."""
    q = f"bench-{_run_id()}-cons"
    conns: list[ra.Connection] = []
    counts: list[list[int]] = []
    state = {"sent": 0, "got": 0, "stop": False, "error": None}
    prod = None
    try:
        setup = ra.Connection(url, timeout=30.0)
        conns.append(setup)
        setup.channel_open(1)
        setup.queue_declare(1, q)
        counts.append([])
        k = 0
        while k < n:
            c = ra.Connection(url, timeout=30.0)
            conns.append(c)
            chans = min(per_conn, n - k)
            for ch in range(1, chans + 1):
                c.channel_open(ch)
                c.basic_qos(ch, 1)
                c.basic_consume(ch, q, tag=f"c{k}", no_ack=False)
                k += 1
            counts.append([0] * (chans + 1))

        def producer():
            p = ra.Connection(url, timeout=30.0)
            try:
                p.channel_open(1)
                template, _ = ra.encode_publish(1, "", q, b"x" * size, p.frame_max, 1)
                batch = template * 50
                while not state["stop"]:
                    if state["sent"] - state["got"] < max_backlog:
                        p.send(batch)
                        state["sent"] += 50
                    else:
                        time.sleep(0.0005)
            except Exception as e:
                state["error"] = f"producer: {type(e).__name__}: {e}"
            finally:
                p.close()

        prod = threading.Thread(target=producer, daemon=True)
        prod.start()
        socks = {c.sock.fileno(): i for i, c in enumerate(conns) if i}
        bufs = {i: bytearray(conns[i].buf) for i in socks.values()}
        t0 = time.monotonic()
        warm, t_end = t0 + warmup, t0 + warmup + duration
        snap = None
        poller = select.poll()
        for fd in socks:
            poller.register(fd, select.POLLIN)
        while True:
            now = time.monotonic()
            if now >= t_end:
                break
            if snap is None and now >= warm:
                snap = [list(x) for x in counts]
            for fd, _ in poller.poll(50):
                i = socks[fd]
                c = conns[i]
                data = c.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("broker closed a consumer connection")
                buf = bufs[i]
                buf += data
                frames, end = ra.split_frames(buf)
                del buf[:end]
                acks = []
                for ftype, ch, payload in frames:
                    if ftype == 1 and payload[:4] == b"\x00\x3c\x00\x3c":
                        counts[i][ch] += 1
                        acks.append(ra.ack_frame(ch, _DELIVER_TAG(payload, 5 + payload[4])[0]))
                    elif ftype == 1 and payload[:4] == b"\x00\x14\x00\x28":
                        raise ra.ChannelClosed(0, f"channel {ch} closed by the broker")
                if acks:
                    state["got"] += len(acks)
                    c.send(b"".join(acks))
        per = [b - a for ca, cb in zip(snap or counts, counts, strict=True)
               for a, b in zip(ca[1:], cb[1:], strict=True)]
        total = sum(per)
        return {"consumers": n, "consume_rate": total / duration,
                "min_per_consumer": min(per), "max_per_consumer": max(per),
                "fairness_max_min": (max(per) / min(per)) if min(per) else None,
                "idle_consumers": sum(1 for x in per if x == 0),
                "errors": [state["error"]] if state["error"] else []}
    finally:
        state["stop"] = True
        if prod is not None:
            prod.join(5)
        _close_all(conns[1:])
        if conns:
            try:
                conns[0].queue_delete(1, q, timeout=60.0)
            except Exception as e:
                print(f"[bench] WARNING: queue.delete {q}: {e}")
            _close(conns[0])
