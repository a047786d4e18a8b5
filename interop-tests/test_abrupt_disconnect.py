"""Every way a connection can end returns its unacknowledged deliveries, as RabbitMQ does.

A consumer holds unacked deliveries (basic.consume with prefetch, or basic.get with
no_ack=False) and its connection ends without it acknowledging anything:

- the consumer process is SIGKILLed (consumer_proc.py, a pika consumer in its own process);
- the process shuts its socket down (shutdown(SHUT_RDWR) + close, no connection.close);
- a raw client resets the TCP connection (SO_LINGER 0 + close -> RST);
- a raw client negotiates heartbeat=1 s and then goes silent (socket open, nothing read):
  the broker drops it after missed heartbeats;
- the client closes cleanly (connection.close, channel.close);
- the broker closes the connection because of a client error (504, 503).

In every case all the deliveries come back exactly once, at the head of the queue in their
original order, with redelivered=true, followed by the messages never delivered; the queue's
ready count is consistent before and after.  The connection's other resources go too:
its exclusive queues are deleted, auto-delete queues whose only consumer it held are
deleted, an exclusive consumer is released and a single-active-consumer queue hands over to
the next consumer, which gets the returned messages first.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from helpers import wait_for

from rawamqp import (
    BASIC_DELIVER,
    BASIC_QOS,
    EXCHANGE_DECLARE,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    QUEUE_DECLARE,
    shortstr,
    table,
)

HERE = Path(__file__).resolve().parent
CONSUMER_PROC = HERE / "consumer_proc.py"
BASIC_QOS_OK = (60, 11)

DURABILITY = pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient"])
REQUEUE_TIMEOUT = 15.0


# ------------------------------------------------------------------ helpers
def _declare(ch, queue, durable, **kw):
    ch.queue_declare(queue, durable=durable, **kw)


def _publish(ch, queue, n, durable, start=0):
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    for i in range(start, start + n):
        ch.basic_publish("", queue, f"m{i}".encode(), props)


def _expected(total, unacked):
    """The first `unacked` messages come back redelivered, then the rest, in order."""
    return [(f"m{i}", i < unacked) for i in range(total)]


def _passive(conn, queue):
    """(message_count, consumer_count) of queue, or the reply code if the declare fails."""
    ch = conn.channel()
    try:
        ok = ch.queue_declare(queue, passive=True).method
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    ch.close()
    return ok.message_count, ok.consumer_count


def _wait_ready(conn, queue, n, timeout=REQUEUE_TIMEOUT):
    """Poll until queue has n ready messages; returns the seconds it took."""
    t0 = time.monotonic()
    last = []

    def ready():
        last[:] = [_passive(conn, queue)]
        return isinstance(last[0], tuple) and last[0][0] == n

    try:
        wait_for(ready, timeout=timeout, interval=0.05, conn=conn, msg=f"{n} ready in {queue}")
    except AssertionError:
        raise AssertionError(f"{queue}: expected {n} ready messages, last passive declare: {last}") from None
    return time.monotonic() - t0


def _collect(conn, got, n, queue, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(got) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)}/{n} deliveries from {queue}: {got}")
        conn.process_data_events(time_limit=0.05)


def _consume_everything(connect, queue, total, settle=0.4):
    """A new consumer takes every ready message (acking them after a settle period in
    which nothing more may arrive); returns [(body, redelivered)].  The queue is then
    empty."""
    conn = connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=0)
    got, tags = [], []

    def cb(_c, m, _p, b):
        got.append((b.decode(), m.redelivered))
        tags.append(m.delivery_tag)

    ctag = ch.basic_consume(queue, cb, auto_ack=False)
    _collect(conn, got, total, queue)
    conn.process_data_events(time_limit=settle)
    assert len(got) == total, f"duplicates: {got}"
    ch.basic_ack(tags[-1], multiple=True)
    ch.basic_cancel(ctag)
    assert _passive(conn, queue) == (0, 0)
    conn.close()
    return got


def _check_requeued(connect, queue, total, unacked):
    """All `total` messages are back (the first `unacked` redelivered) exactly once, in order."""
    watcher = connect()
    elapsed = _wait_ready(watcher, queue, total)
    watcher.close()
    assert _consume_everything(connect, queue, total) == _expected(total, unacked)
    return elapsed


# ------------------------------------------------------------------ consumer process
class ConsumerProc:
    def __init__(self, proc: subprocess.Popen, stderr_path: Path):
        self.proc = proc
        self.stderr_path = stderr_path
        self.received: list[list[tuple[str, bool]]] = []
        self._buf = b""

    def _readline(self, what, timeout=20.0):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in self._buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    self._fail(f"no {what} within {timeout}s")
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self._fail(f"exited with {self.proc.wait(5)} before {what}")
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        line = line.decode()
        assert line.startswith(what), line
        return line

    def wait_ready(self):
        line = self._readline("READY")
        self.received = [[tuple(x) for x in got] for got in json.loads(line[6:])["received"]]
        return self.received

    def shutdown_socket(self):
        """end="shutdown": the process shuts its socket down now (and stays alive)."""
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        self._readline("SHUT")
        assert self.alive

    def _fail(self, why):
        self.kill()
        pytest.fail(f"consumer_proc.py {why}\n--- stderr ---\n"
                    + self.stderr_path.read_text(errors="replace")[-3000:], pytrace=False)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    @property
    def alive(self):
        return self.proc.poll() is None


@pytest.fixture
def consumer_proc(amqp_params, tmp_path):
    """Factory: consumer_proc(channels, end="hang") -> ConsumerProc that printed READY.

    See consumer_proc.py for the spec.  Every process is SIGKILLed at teardown.
    """
    procs: list[ConsumerProc] = []

    def _start(channels, end="hang"):
        spec = {"channels": channels, "end": end}
        err = tmp_path / f"consumer-{len(procs)}.stderr"
        with open(err, "wb") as f:
            p = subprocess.Popen([sys.executable, str(CONSUMER_PROC), amqp_params.url, json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f,
                                 cwd=str(HERE))
        cp = ConsumerProc(p, err)
        procs.append(cp)
        cp.wait_ready()
        return cp

    yield _start
    for cp in procs:
        try:
            cp.kill()
        except Exception:
            pass
        for pipe in (cp.proc.stdin, cp.proc.stdout):
            try:
                pipe.close()
            except Exception:
                pass


def _consume_spec(queue, count, prefetch=None, **extra):
    return {"queue": queue, "mode": "consume", "count": count,
            "prefetch": count if prefetch is None else prefetch, **extra}


# ------------------------------------------------------------------ raw consumer
def _raw_delivery(raw, timeout=5.0):
    """Read one basic.deliver with its content; returns (delivery_tag, redelivered, body)."""
    ch, cm, r = raw.read_method(timeout)
    assert cm == BASIC_DELIVER, cm
    r.shortstr()
    tag, redelivered = r.longlong(), bool(r.octet() & 1)
    body, size = b"", None
    while size is None or len(body) < size:
        ftype, _, payload = raw.read_frame(timeout)
        if ftype == FRAME_HEARTBEAT:
            continue
        if ftype == FRAME_HEADER:
            size = struct.unpack(">Q", payload[4:12])[0]
        else:
            assert ftype == FRAME_BODY, ftype
            body += payload
    return tag, redelivered, body.decode()


def _raw_consumer(raw_socket, amqp_params, queue, n, heartbeat=0):
    """A raw connection consuming `queue` on channel 1 with prefetch n, holding n unacked."""
    raw = raw_socket(timeout=10)
    raw.handshake(vhost=amqp_params.vhost, heartbeat=heartbeat)
    raw.channel_open(1)
    raw.send_method(1, BASIC_QOS, struct.pack(">IHB", 0, n, 0))
    raw.expect(BASIC_QOS_OK, 1)
    raw.basic_consume(1, queue)
    got = [_raw_delivery(raw) for _ in range(n)]
    return raw, [(body, red) for _tag, red, body in got]


def _reset(raw):
    """Close with SO_LINGER 0: the kernel sends a TCP RST instead of a FIN."""
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.sock.close()


# ------------------------------------------------------------------ killed consumer
N_UNACKED, N_READY = 5, 2


@DURABILITY
@pytest.mark.parametrize("how", ["sigkill", "socket-shutdown", "tcp-rst"])
def test_unacked_deliveries_come_back_when_connection_dies(
        connect, consumer_proc, raw_socket, amqp_params, uid, cleanup, how, durable):
    total = N_UNACKED + N_READY
    ch = connect().channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, total, durable)
    if how == "tcp-rst":
        raw, received = _raw_consumer(raw_socket, amqp_params, uid, N_UNACKED)
    else:
        proc = consumer_proc([_consume_spec(uid, N_UNACKED)],
                             end="shutdown" if how == "socket-shutdown" else "hang")
        [received] = proc.received
    assert received == [(f"m{i}", False) for i in range(N_UNACKED)]
    # held by the consumer: only the undelivered ones are ready
    assert _passive(ch.connection, uid) == (N_READY, 1)

    if how == "sigkill":
        proc.kill()
    elif how == "tcp-rst":
        _reset(raw)
    else:
        proc.shutdown_socket()  # the socket goes away, the process does not
    _check_requeued(connect, uid, total, N_UNACKED)


@DURABILITY
def test_silent_client_dropped_after_missed_heartbeats_and_deliveries_requeued(
        connect, raw_socket, amqp_params, uid, cleanup, durable):
    """heartbeat=1: the client stops sending (and reading) but keeps its socket open; the
    broker closes it after ~2 missed heartbeats and requeues its deliveries."""
    total = N_UNACKED + N_READY
    ch = connect().channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, total, durable)
    raw, received = _raw_consumer(raw_socket, amqp_params, uid, N_UNACKED, heartbeat=1)
    assert received == [(f"m{i}", False) for i in range(N_UNACKED)]
    assert raw.tune is not None
    # from now on: silence, socket open, nothing read
    assert _passive(ch.connection, uid) == (N_READY, 1)
    elapsed = _check_requeued(connect, uid, total, N_UNACKED)
    assert elapsed < REQUEUE_TIMEOUT
    raw.assert_eof(timeout=5.0)  # and the broker really closed the socket


@DURABILITY
def test_several_channels_consume_and_get_all_come_back(connect, consumer_proc, uid, cleanup, durable):
    """One connection, three channels: two consumers on different queues (one with messages
    left over) and unacked basic.gets on a third queue.  SIGKILL: all of them come back."""
    ch = connect().channel()
    q1, q2, q3 = (cleanup.queue(f"{uid}-{i}") for i in (1, 2, 3))
    for q, n in ((q1, 4), (q2, 2), (q3, 3)):
        _declare(ch, q, durable)
        _publish(ch, q, n, durable)
    proc = consumer_proc([
        _consume_spec(q1, 3),
        _consume_spec(q2, 2),
        {"queue": q3, "mode": "get", "count": 2},
    ])
    assert proc.received == [[("m0", False), ("m1", False), ("m2", False)],
                             [("m0", False), ("m1", False)],
                             [("m0", False), ("m1", False)]]
    assert [_passive(ch.connection, q) for q in (q1, q2, q3)] == [(1, 1), (0, 1), (1, 0)]
    proc.kill()
    _check_requeued(connect, q1, 4, 3)
    _check_requeued(connect, q2, 2, 2)
    _check_requeued(connect, q3, 3, 2)


@DURABILITY
@pytest.mark.parametrize("how", ["sigkill", "socket-shutdown"])
def test_unacked_basic_get_comes_back(connect, consumer_proc, uid, cleanup, durable, how):
    ch = connect().channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, 5, durable)
    proc = consumer_proc([{"queue": uid, "mode": "get", "count": 3}],
                         end="shutdown" if how == "socket-shutdown" else "hang")
    assert proc.received == [[("m0", False), ("m1", False), ("m2", False)]]
    assert _passive(ch.connection, uid) == (2, 0)
    if how == "sigkill":
        proc.kill()
    else:
        proc.shutdown_socket()
    _check_requeued(connect, uid, 5, 3)


# ------------------------------------------------------------------ owned resources
def test_exclusive_queue_of_killed_connection_is_deleted(connect, consumer_proc, uid, cleanup):
    conn = connect()
    proc = consumer_proc([{**_consume_spec(cleanup.queue(uid), 0), "declare": {"exclusive": True}}])
    conn.channel().basic_publish("", uid, b"x")
    assert _passive(conn, uid) == 405  # RESOURCE_LOCKED: owned by the consumer's connection
    proc.kill()
    wait_for(lambda: _passive(conn, uid) == 404, timeout=REQUEUE_TIMEOUT, conn=conn,
             msg=f"exclusive queue {uid} deleted")


@DURABILITY
def test_auto_delete_queue_whose_only_consumer_was_killed_is_deleted(
        connect, consumer_proc, uid, cleanup, durable):
    conn = connect()
    ch = conn.channel()
    _declare(ch, cleanup.queue(uid), durable, auto_delete=True)
    _publish(ch, uid, 3, durable)
    proc = consumer_proc([_consume_spec(uid, 3)])
    assert _passive(conn, uid) == (0, 1)
    proc.kill()
    wait_for(lambda: _passive(conn, uid) == 404, timeout=REQUEUE_TIMEOUT, conn=conn,
             msg=f"auto-delete queue {uid} deleted")


@DURABILITY
def test_exclusive_consumer_released_when_killed(connect, consumer_proc, uid, cleanup, durable):
    conn = connect()
    ch = conn.channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, 3, durable)
    proc = consumer_proc([_consume_spec(uid, 3, exclusive_consumer=True)])

    def try_consume(got):
        c = conn.channel()
        try:
            c.basic_consume(uid, lambda _c, m, _p, b: got.append((b.decode(), m.redelivered)),
                            auto_ack=True, exclusive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code
        return c

    assert try_consume([]) == 403  # ACCESS_REFUSED: in exclusive use
    proc.kill()
    got: list = []
    wait_for(lambda: not isinstance(try_consume(got), int), timeout=REQUEUE_TIMEOUT, interval=0.05,
             conn=conn, msg="exclusive consume after the holder was killed")
    _collect(conn, got, 3, uid)
    assert got == _expected(3, 3)
    assert try_consume([]) == 403  # and ours is exclusive now


@DURABILITY
def test_single_active_consumer_hands_over_with_returned_messages_first(
        connect, consumer_proc, uid, cleanup, durable):
    conn = connect()
    ch = conn.channel()
    _declare(ch, cleanup.queue(uid), durable, arguments={"x-single-active-consumer": True})
    _publish(ch, uid, 6, durable)
    proc = consumer_proc([_consume_spec(uid, 3)])  # the active consumer, 3 unacked
    assert proc.received == [[("m0", False), ("m1", False), ("m2", False)]]
    second = conn.channel()
    second.basic_qos(prefetch_count=0)
    got: list = []
    tags: list = []

    def cb(_c, m, _p, b):
        got.append((b.decode(), m.redelivered))
        tags.append(m.delivery_tag)

    second.basic_consume(uid, cb, auto_ack=False)
    conn.process_data_events(time_limit=0.4)
    assert got == []  # waiting
    assert _passive(conn, uid) == (3, 2)
    proc.kill()
    _collect(conn, got, 6, uid)
    conn.process_data_events(time_limit=0.3)
    assert got == _expected(6, 3)
    second.basic_ack(tags[-1], multiple=True)
    conn.process_data_events(time_limit=0.1)
    assert _passive(conn, uid) == (0, 1)


# ------------------------------------------------------------------ clean closes
@DURABILITY
@pytest.mark.parametrize("close", ["connection.close", "channel.close"])
def test_clean_close_with_unacked_requeues(connect, uid, cleanup, durable, close):
    ch = connect().channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, N_UNACKED + N_READY, durable)
    c = connect()
    cch = c.channel()
    cch.basic_qos(prefetch_count=N_UNACKED)
    got: list = []
    cch.basic_consume(uid, lambda _c, m, _p, b: got.append((b.decode(), m.redelivered)), auto_ack=False)
    _collect(c, got, N_UNACKED, uid)
    assert got == [(f"m{i}", False) for i in range(N_UNACKED)]
    if close == "connection.close":
        c.close()
    else:
        cch.close()
        assert c.is_open
    _check_requeued(connect, uid, N_UNACKED + N_READY, N_UNACKED)


# ------------------------------------------------------------------ broker-initiated close
PROVOKE = {
    # queue.declare on a channel that was never opened -> 504 CHANNEL_ERROR
    "504-unopened-channel": (
        lambda raw, uid: raw.send_method(5, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr("")
                                         + b"\x00" + table({})),
        504, "CHANNEL_ERROR - expected 'channel.open'"),
    # exchange.declare with an unknown type on channel 2 -> 503 COMMAND_INVALID
    "503-unknown-exchange-type": (
        lambda raw, uid: (raw.channel_open(2),
                          raw.send_method(2, EXCHANGE_DECLARE, struct.pack(">H", 0) + shortstr(uid)
                                          + shortstr("x-itest-bogus") + b"\x00" + table({}))),
        503, "COMMAND_INVALID - unknown exchange type 'x-itest-bogus'"),
}


@DURABILITY
@pytest.mark.parametrize("provoke", list(PROVOKE))
@pytest.mark.parametrize("close_ok", [True, False], ids=["close-ok", "no-close-ok"])
def test_connection_error_requeues_deliveries_of_other_channels(
        connect, raw_socket, amqp_params, uid, cleanup, durable, provoke, close_ok):
    """A connection error provoked on another channel closes the connection; the unacked
    deliveries on channel 1 come back as soon as the broker has sent connection.close,
    whether or not the client answers close-ok, while the client's socket is still open."""
    total = N_UNACKED + N_READY
    ch = connect().channel()
    _declare(ch, cleanup.queue(uid), durable)
    _publish(ch, uid, total, durable)
    raw, received = _raw_consumer(raw_socket, amqp_params, uid, N_UNACKED)
    assert received == [(f"m{i}", False) for i in range(N_UNACKED)]
    send, code, text = PROVOKE[provoke]
    send(raw, uid)
    got = raw.expect_connection_close(close_ok=close_ok)
    assert got[:2] == (code, text), got
    # requeued by the closing handshake itself: our end of the socket is still open
    _check_requeued(connect, uid, total, N_UNACKED)
    if close_ok:
        # the client's close-ok is its last frame: the broker closes at once, as RabbitMQ
        raw.assert_eof(timeout=1.0)
