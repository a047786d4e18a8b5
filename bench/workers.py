"""Producer and consumer processes. Hot loops are written for low per-message
CPU: pre-encoded publish frames patched in place, large recv_into chunks
parsed with struct.unpack_from, one ack (multiple=true) per read chunk."""
from __future__ import annotations

import select
import signal
import struct
import time
import traceback
from array import array

import rawamqp as ra

_FH_unpack = struct.Struct(">BHI").unpack_from
_CM_unpack = struct.Struct(">HH").unpack_from
_Q_unpack = struct.Struct(">Q").unpack_from
_Q_pack_into = struct.Struct(">Q").pack_into
_ACK_FRAME = struct.Struct(">BHIHHQB")

CTL_T0 = 0      # shared control array slots
CTL_ABORT = 1


def _wait_start(ctl, start_evt, timeout=120.0):
    if not start_evt.wait(timeout):
        raise TimeoutError("start signal never came")
    if ctl[CTL_ABORT]:
        return None
    return ctl[CTL_T0]


def _make_body(size: int) -> bytes:
    # 8-byte monotonic timestamp (patched per send) + filler
    filler = (b"triomq-bench-" * (size // 13 + 1))
    return b"\x00" * min(8, size) + filler[: max(0, size - 8)]


class ConfirmTracker:
    __slots__ = ("floor", "nacked", "resolved", "singles")

    def __init__(self):
        self.floor = 0          # every tag <= floor is resolved
        self.singles = set()    # individually resolved tags > floor
        self.resolved = 0
        self.nacked = 0

    def on(self, tag, multiple, nack):
        floor = self.floor
        if tag <= floor:
            return
        if multiple:
            n = tag - floor
            s = self.singles
            if s:
                below = [x for x in s if x <= tag]
                n -= len(below)
                s.difference_update(below)
            self.floor = tag
        else:
            s = self.singles
            if tag in s:
                return
            n = 1
            if tag == floor + 1:
                floor = tag
                while floor + 1 in s:
                    floor += 1
                    s.discard(floor)
                self.floor = floor
            else:
                s.add(tag)
        self.resolved += n
        if nack:
            self.nacked += n


def _handle_control(conn, cls, meth, rbuf, p):
    """Non-hot method frames seen in a data stream. Raises on close."""
    if (cls, meth) == ra.CHANNEL_CLOSE or (cls, meth) == ra.CONNECTION_CLOSE:
        r = ra._Reader(rbuf, p + 11)
        code, text = r.short(), r.shortstr()
        c, m = r.short(), r.short()
        what = "connection" if cls == 10 else "channel"
        try:
            conn.send(ra.method_frame(0 if cls == 10 else 1, cls, 51 if cls == 10 else 41))
        except OSError:
            pass
        conn.closed = cls == 10
        raise ra.ChannelClosed(code, text, c, m, what=what)
    if (cls, meth) == ra.CONNECTION_BLOCKED:
        conn.blocked = True
    elif (cls, meth) == ra.CONNECTION_UNBLOCKED:
        conn.blocked = False


# ----------------------------------------------------------------------------
# producer
# ----------------------------------------------------------------------------

def producer_main(idx, cfg, topo, ctl, start_evt, resq, pub_counts, cons_counts):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    res = {"role": "producer", "idx": idx, "error": None}
    conn = None
    try:
        conn = ra.Connection(cfg["url"], timeout=cfg["io_timeout"])
        conn.channel_open(1)
        confirms = cfg["confirms"]
        if confirms:
            conn.confirm_select(1)
        qi = idx % len(topo["queues"])
        exchange, rkeys = topo["exchange"], topo["publish_keys"][qi]
        # one routing key, or a list of equally long keys used in turn (a key mix)
        body = _make_body(cfg["size"])
        templates = [ra.encode_publish(1, exchange, k, body, conn.frame_max,
                                       2 if cfg["persistent"] else 1)
                     for k in (rkeys if isinstance(rkeys, list) else [rkeys])]
        template, body_off = templates[0]
        if any(len(t) != len(template) for t, _ in templates):
            raise ValueError("the routing keys of one producer must all have the same length")
        stamp = cfg["size"] >= 8
        batch = max(1, cfg["publish_batch"])
        L = len(template)
        out = bytearray(b"".join(templates[k % len(templates)][0] for k in range(batch)))
        outmv = memoryview(out)
        offsets = [k * L + body_off for k in range(batch)]
        window = cfg["confirm_window"] if confirms else 0
        rate = cfg["rate"] / cfg["producers"] if cfg["rate"] else 0.0
        max_backlog = cfg["max_backlog"]
        nprod = len(pub_counts)
        # a fanout publish becomes one delivery per queue: count the backlog in deliveries
        fan = len(topo["queues"]) if topo.get("type") == "fanout" else 1
        sock = conn.sock
        sock.settimeout(cfg["io_timeout"])
        rbuf = bytearray(1 << 20)
        rmv = memoryview(rbuf)
        rlen = 0
        tracker = ConfirmTracker()
        on_confirm = tracker.on
        poller = select.poll()
        poller.register(sock, select.POLLIN)

        def poll(block_timeout):
            """Read & parse whatever the broker sent (confirms, closes)."""
            nonlocal rlen
            if not poller.poll(0 if block_timeout is None else int(block_timeout * 1000) + 1):
                return
            n = sock.recv_into(rmv[rlen:])
            if n == 0:
                raise ConnectionError("broker closed the connection")
            end = rlen + n
            p = 0
            while p + 7 <= end:
                ftype, ch, size = _FH_unpack(rbuf, p)
                fend = p + 7 + size
                if fend >= end:
                    break
                if ftype == 1:
                    cls, meth = _CM_unpack(rbuf, p + 7)
                    if cls == 60 and (meth == 80 or meth == 120):
                        on_confirm(_Q_unpack(rbuf, p + 11)[0], rbuf[p + 19] & 1, meth == 120)
                    else:
                        _handle_control(conn, cls, meth, rbuf, p)
                p = fend + 1
            if p < end:
                rbuf[0:end - p] = rbuf[p:end]
            rlen = end - p

        resq.put(("ready", "producer", idx))
        t0 = _wait_start(ctl, start_evt)
        if t0 is None:
            return
        warm = t0 + cfg["warmup"]
        t_end = warm + cfg["duration"]
        while time.monotonic() < t0:
            time.sleep(0.001)

        sent = 0
        sent_w = conf_w = None
        cpu_w = None
        batches = 0
        mono = time.monotonic
        mono_ns = time.monotonic_ns
        while True:
            now = mono()
            if now >= t_end:
                break
            if sent_w is None and now >= warm:
                sent_w, conf_w, cpu_w = sent, tracker.resolved, time.process_time()
            n = batch
            wait_for = None
            if window:
                avail = window - (sent - tracker.resolved)
                if avail < n:
                    n = avail
                    if n <= 0:
                        wait_for = min(0.05, t_end - now)
            if rate:
                due = int((now - t0) * rate) + 1 - sent
                if due < n:
                    n = due
                    if n <= 0:
                        nxt = t0 + (sent + 0) / rate
                        w = max(0.0, min(nxt - now, t_end - now))
                        wait_for = w if wait_for is None else min(wait_for, w)
            if max_backlog and n > 0:
                backlog = sum(pub_counts[:nprod]) * fan - sum(cons_counts[:])
                if backlog > max_backlog:
                    n = 0
                    wait_for = 0.0005 if wait_for is None else min(wait_for, 0.0005)
            if n > 0:
                if stamp:
                    ts = mono_ns()
                    for k in range(n):
                        _Q_pack_into(out, offsets[k], ts)
                sock.sendall(outmv[: n * L] if n != batch else out)
                sent += n
                pub_counts[idx] = sent
                batches += 1
                if window or (batches & 31) == 0:
                    poll(None)
            else:
                w = wait_for if wait_for is not None else 0.0005
                if window or w > 0.002:
                    poll(w)   # select(): also notices confirms / broker errors
                elif w > 0:
                    time.sleep(w)
        if sent_w is None:
            sent_w, conf_w, cpu_w = sent, tracker.resolved, time.process_time()
        cpu = time.process_time() - cpu_w
        res.update(sent=sent - sent_w, confirmed=tracker.resolved - conf_w, cpu=cpu,
                   total_sent=sent)
        # let outstanding confirms drain briefly (not counted in the window)
        if window:
            dl = time.monotonic() + cfg["drain_timeout"]
            while tracker.resolved < sent and time.monotonic() < dl:
                poll(0.05)
        res.update(total_resolved=tracker.resolved, nacked=tracker.nacked,
                   unconfirmed=sent - tracker.resolved if window else 0,
                   blocked=conn.blocked)
    except Exception as e:
        res["error"] = f"producer {idx}: {type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    finally:
        if conn is not None:
            conn.close(timeout=3.0)
        resq.put(("result", res))


# ----------------------------------------------------------------------------
# consumer
# ----------------------------------------------------------------------------

def consumer_main(idx, cfg, topo, ctl, start_evt, resq, pub_counts, cons_counts):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    res = {"role": "consumer", "idx": idx, "error": None}
    conn = None
    try:
        conn = ra.Connection(cfg["url"], timeout=cfg["io_timeout"])
        conn.channel_open(1)
        manual = cfg["manual_ack"]
        prefetch = cfg["prefetch"]
        if manual and prefetch:
            conn.basic_qos(1, prefetch)
        qi = idx % len(topo["queues"])
        conn.basic_consume(1, topo["queues"][qi], tag=f"bench-c{idx}", no_ack=not manual)
        ack_multiple = cfg["ack_multiple"]
        ack_every = max(1, cfg["ack_every"])
        if manual and prefetch:
            ack_every = min(ack_every, max(1, prefetch // 2))
        sock = conn.sock
        cap = 8 << 20
        rbuf = bytearray(cap)
        rmv = memoryview(rbuf)
        # anything the slow path already buffered
        wpos = len(conn.buf)
        rbuf[:wpos] = conn.buf
        conn.buf.clear()

        resq.put(("ready", "consumer", idx))
        t0 = _wait_start(ctl, start_evt)
        if t0 is None:
            return
        warm = t0 + cfg["warmup"]
        t_end = warm + cfg["duration"]
        sock.settimeout(0.05)

        lat = array("q")
        lat_append = lat.append
        count = 0
        count_w = None
        cpu_w = None
        body_rem = 0
        need_ts = False
        last_tag = 0
        unacked = 0
        tags = [] if (manual and not ack_multiple) else None
        stamp = cfg["size"] >= 8
        mono = time.monotonic
        mono_ns = time.monotonic_ns
        ack_pack = _ACK_FRAME.pack
        record = False
        rpos = 0
        while True:
            now = mono()
            if now >= t_end:
                break
            if count_w is None and now >= warm:
                count_w, cpu_w = count, time.process_time()
                record = True
            try:
                n = sock.recv_into(rmv[wpos:])
            except TimeoutError:
                n = -1
            if n == 0:
                raise ConnectionError("broker closed the connection")
            if n > 0:
                t_ns = mono_ns()
                wpos += n
                p = rpos
                while p + 7 <= wpos:
                    ftype, ch, size = _FH_unpack(rbuf, p)
                    fend = p + 7 + size
                    if fend >= wpos:
                        break
                    if ftype == 3:
                        if need_ts:
                            need_ts = False
                            if record and stamp:
                                lat_append(t_ns - _Q_unpack(rbuf, p + 7)[0])
                        body_rem -= size
                        if body_rem <= 0:
                            count += 1
                    elif ftype == 2:
                        body_rem = _Q_unpack(rbuf, p + 11)[0]
                        if body_rem == 0:
                            count += 1
                        else:
                            need_ts = True
                    elif ftype == 1:
                        cls, meth = _CM_unpack(rbuf, p + 7)
                        if cls == 60 and meth == 60:
                            last_tag = _Q_unpack(rbuf, p + 12 + rbuf[p + 11])[0]
                            unacked += 1
                            if tags is not None:
                                tags.append(last_tag)
                        else:
                            _handle_control(conn, cls, meth, rbuf, p)
                    p = fend + 1
                if p >= wpos:
                    rpos = wpos = 0
                elif wpos > (cap >> 1):
                    rem = wpos - p
                    rbuf[0:rem] = rbuf[p:wpos]
                    rpos, wpos = 0, rem
                else:
                    rpos = p
                cons_counts[idx] = count
            if manual and unacked and (unacked >= ack_every or n < 0):
                if tags is None:
                    sock.sendall(ack_pack(1, 1, 13, 60, 80, last_tag, 1) + b"\xce")
                else:
                    sock.sendall(b"".join(ack_pack(1, 1, 13, 60, 80, t, 0) + b"\xce" for t in tags))
                    tags.clear()
                unacked = 0
        if count_w is None:
            count_w, cpu_w = count, time.process_time()
        res.update(received=count - count_w, cpu=time.process_time() - cpu_w,
                   total_received=count, lat=lat.tobytes())
    except Exception as e:
        res["error"] = f"consumer {idx}: {type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    finally:
        if conn is not None:
            conn.close(timeout=3.0)
        resq.put(("result", res))
