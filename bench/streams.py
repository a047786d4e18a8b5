"""Stream queues over AMQP 0-9-1: publish with confirms, consume from ``first``, memory
against length, restart time; TrioMQ (started here) and the machine's RabbitMQ, same run.

    .venv/bin/python -m bench.streams [-n 20000] [--size 100] [--grow 5] [--no-rabbit]
    .venv/bin/python -m bench.streams --log-only 1000000 [--size 150]
    .venv/bin/python -m bench.streams --restart-gb 10 [--size 65536] [--rounds 3]
    .venv/bin/python -m bench.streams --retention-gb 3 [--max-bytes 200000000]

For each broker: publish ``n`` messages into a fresh stream (a window of ``--window``
unconfirmed, pika's SelectConnection), then read them all from ``first`` (prefetch 1000,
an ack with multiple=true every 500), then publish ``(grow - 1) * n`` more and read the
RSS again (a stream's memory must not follow its length), then (TrioMQ) restart the
broker and time until the stream answers again. Prints msg/s and broker CPU per message
(from /proc: utime + stime of the broker's process tree).
"""
from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import pika

from .procinfo import TrioMQProcess, cpu_seconds, pid_listening_on, rss_kb

S = {"x-queue-type": "stream"}
RABBIT = "amqp://guest:guest@127.0.0.1:5672/"


def publish(url: str, queue: str, n: int, window: int, body: bytes) -> float:
    conn = pika.SelectConnection(pika.URLParameters(url))
    state = {"sent": 0, "acked": 0, "t0": 0.0, "t1": 0.0, "ch": None}
    props = pika.BasicProperties(delivery_mode=2)

    def pump():
        ch = state["ch"]
        while state["sent"] < n and state["sent"] - state["acked"] < window:
            ch.basic_publish("", queue, body, props)
            state["sent"] += 1

    def on_confirm(frame):
        m = frame.method
        if isinstance(m, pika.spec.Basic.Nack):
            raise RuntimeError("nacked")
        state["acked"] = m.delivery_tag if m.multiple else state["acked"] + 1
        if state["acked"] >= n:
            state["t1"] = time.perf_counter()
            conn.close()
        else:
            pump()

    def on_channel(ch):
        state["ch"] = ch
        ch.confirm_delivery(on_confirm, callback=lambda _f: start())

    def start():
        state["t0"] = time.perf_counter()
        pump()

    conn.add_on_open_callback(lambda c: c.channel(on_open_callback=on_channel))
    conn.add_on_close_callback(lambda *_a: conn.ioloop.stop())
    conn.ioloop.start()
    return state["t1"] - state["t0"]


def consume_first(url: str, queue: str, n: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    t0 = time.perf_counter()
    for got, (method, _p, _b) in enumerate(ch.consume(
            queue, inactivity_timeout=30, arguments={"x-stream-offset": "first"}), 1):
        if method is None:
            raise RuntimeError(f"{queue}: only {got - 1} of {n} arrived")
        if got % 500 == 0 or got == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got == n:
            break
    elapsed = time.perf_counter() - t0
    ch.cancel()
    conn.close()
    return elapsed


def declare(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=S)
    conn.close()


def delete(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(queue)
    conn.close()


def run_one(name: str, url: str, pid: int, args, proc: TrioMQProcess | None = None) -> dict:
    queue = f"bench-stream-{uuid.uuid4().hex[:8]}"
    body = b"x" * args.size
    declare(url, queue)
    row = {"broker": name}
    if proc is not None:  # the restart time with the stream empty, for comparison
        row["restart_empty_s"] = restart_time(proc, url, queue)
        pid = proc.pid
    try:
        c0 = cpu_seconds(pid) or 0.0
        t = publish(url, queue, args.n, args.window, body)
        c1 = cpu_seconds(pid) or 0.0
        row["publish_rate"] = args.n / t
        row["publish_cpu_us"] = (c1 - c0) / args.n * 1e6
        t = consume_first(url, queue, args.n)
        c2 = cpu_seconds(pid) or 0.0
        row["consume_rate"] = args.n / t
        row["consume_cpu_us"] = (c2 - c1) / args.n * 1e6
        row["rss_mb_at_n"] = (rss_kb(pid) or 0) / 1024
        if args.grow > 1:
            publish(url, queue, (args.grow - 1) * args.n, args.window, body)
            row["rss_mb_at_grow"] = (rss_kb(pid) or 0) / 1024
    finally:
        if not args.keep:
            delete(url, queue)
    row["queue"] = queue
    return row


def restart_time(proc: TrioMQProcess, url: str, queue: str) -> float:
    p = proc.proc
    p.terminate()
    p.wait(60)
    t0 = time.perf_counter()
    proc.start()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(queue, passive=True)
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def log_only(records: int, size: int) -> None:
    """The log alone, in this process: append rate (chunks of 2,000 records), then the time
    to open it again and to attach a reader near the end (index seek)."""
    import shutil
    import tempfile

    from broker.streams.log import StreamLog
    directory = tempfile.mkdtemp(prefix="bench-stream-log-")
    try:
        lg = StreamLog(directory)
        rec = b"x" * size
        t0 = time.perf_counter()
        for i in range(records):
            lg.append_record(rec)
            if i % 2000 == 1999:
                lg.flush_batch()
        lg.commit()
        appended = time.perf_counter() - t0
        lg.close()
        t0 = time.perf_counter()
        lg = StreamLog(directory)
        opened = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader = lg.reader(records - records // 5)
        reader.next_chunk()
        seek = time.perf_counter() - t0
        reader.close()
        lg.close()
        print(f"log: {records:,} records of {size} B: append {records / appended:,.0f} rec/s; "
              f"open {opened * 1000:.1f} ms; attach at offset {records - records // 5:,} "
              f"{seek * 1000:.2f} ms")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _wait_listening(port: int, proc, timeout: float = 120.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("TrioMQ exited during startup")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("TrioMQ did not listen in time")


def first_from_last(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    got: list = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append(m.delivery_tag),
                     arguments={"x-stream-offset": "last"})
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.01)
    conn.close()  # a stream queue's unacked deliveries are dropped with the channel


def restart_big(gb: float, size: int, window: int, rounds: int) -> None:
    """A stream of ``gb`` GB (messages of ``size`` bytes, through AMQP 0-9-1 with confirms),
    then ``rounds`` restarts (SIGTERM, ``sync``, a new process): seconds to listening (a TCP
    connect, polled every 10 ms) and to the first delivery from ``last``; RSS after each.
    The data directory is removed at the end."""
    import os
    import shutil
    import subprocess

    proc = TrioMQProcess(extra_args=["--http-port", "0"], quiet=True).start()
    queue = "bench-stream-big"
    try:
        declare(proc.url, queue)
        n = int(gb * 1e9) // size
        t = publish(proc.url, queue, n, window, b"x" * size)
        on_disk = sum(f.stat().st_size for f in __import__("pathlib").Path(
            proc.data_dir).rglob("*") if f.is_file())
        print(f"published {n:,} messages of {size:,} B in {t:.0f} s; data dir "
              f"{on_disk / 1e9:.2f} GB; RSS {(rss_kb(proc.pid) or 0) / 1024:.0f} MB")
        for r in range(rounds):
            proc.proc.terminate()  # type: ignore[union-attr]
            proc.proc.wait(120)  # type: ignore[union-attr]
            os.sync()  # the writeback is not the next start's
            log = open(proc.log_path, "ab")  # noqa: SIM115
            t0 = time.perf_counter()
            proc.proc = subprocess.Popen(proc.cmd, cwd=str(Path(__file__).resolve().parent.parent),
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            _wait_listening(proc.port, proc.proc)
            t_listen = time.perf_counter() - t0
            cpu_listen = cpu_seconds(proc.pid) or 0.0
            first_from_last(proc.url, queue)
            t_first = time.perf_counter() - t0
            cpu_first = cpu_seconds(proc.pid) or 0.0
            # the broker's own CPU time says what it does; on a loaded machine the wall
            # time is also waiting for a core
            print(f"restart {r + 1}: listening {t_listen:.2f} s (broker CPU {cpu_listen:.2f} s), "
                  f"first delivery from last {t_first:.2f} s (CPU {cpu_first:.2f} s), "
                  f"RSS {(rss_kb(proc.pid) or 0) / 1024:.0f} MB")
        with open(proc.log_path, errors="replace") as f:
            opened = [ln for ln in f if "opened in" in ln]
        if opened:
            print("broker:", opened[-1].strip())
    finally:
        proc.stop()
        shutil.rmtree(proc.data_dir, ignore_errors=True)


def retention(gb: float, size: int, window: int, max_bytes: int, segment: int,
               every: float) -> None:
    """Publish ``gb`` GB continuously into a stream with ``x-max-length-bytes`` and
    ``x-stream-max-segment-size-bytes``; the stream directory's size sampled after each
    ``every`` GB: it must stay near ``max_bytes`` + a segment, however much went in."""
    import shutil
    from pathlib import Path as P

    proc = TrioMQProcess(extra_args=["--http-port", "0"], quiet=True).start()
    queue = "bench-stream-retention"
    try:
        conn = pika.BlockingConnection(pika.URLParameters(proc.url))
        conn.channel().queue_declare(queue, durable=True, arguments={
            **S, "x-max-length-bytes": max_bytes, "x-stream-max-segment-size-bytes": segment})
        conn.close()
        body = b"x" * size
        per_step = int(every * 1e9) // size
        sizes = []
        for step in range(round(gb / every)):
            publish(proc.url, queue, per_step, window, body)
            on_disk = sum(f.stat().st_size for f in (P(proc.data_dir) / "streams").rglob("*")
                          if f.is_file())
            sizes.append(on_disk)
            print(f"after {(step + 1) * every:.1f} GB published: stream files "
                  f"{on_disk / 1e6:,.0f} MB, RSS {(rss_kb(proc.pid) or 0) / 1024:.0f} MB")
        print(f"max-length-bytes {max_bytes / 1e6:,.0f} MB, segments of {segment / 1e6:,.0f} "
              f"MB: largest on disk {max(sizes) / 1e6:,.0f} MB")
    finally:
        proc.stop()
        shutil.rmtree(proc.data_dir, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--grow", type=int, default=5, help="stream length x this for the RSS row")
    ap.add_argument("--no-rabbit", action="store_true")
    ap.add_argument("--rabbit-url", default=RABBIT)
    ap.add_argument("--log-only", type=int, metavar="RECORDS",
                    help="measure the log alone with this many records, no broker")
    ap.add_argument("--restart-gb", type=float, metavar="GB",
                    help="restart times with a stream of this size (messages of --size)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--retention-gb", type=float, metavar="GB",
                    help="publish this much into a stream with --max-bytes retention")
    ap.add_argument("--max-bytes", type=int, default=200_000_000)
    ap.add_argument("--segment-bytes", type=int, default=50_000_000)
    args = ap.parse_args(argv)
    if args.retention_gb:
        retention(args.retention_gb, args.size, args.window, args.max_bytes,
                  args.segment_bytes, 0.5)
        return
    if args.restart_gb:
        restart_big(args.restart_gb, args.size, args.window, args.rounds)
        return
    if args.log_only:
        log_only(args.log_only, args.size)
        return
    rows = []
    proc = TrioMQProcess(extra_args=["--http-port", "0"], quiet=True).start()
    try:
        args.keep = True
        row = run_one("TrioMQ", proc.url, proc.pid, args, proc)
        row["restart_s"] = restart_time(proc, proc.url, row["queue"])
        row["stream_messages"] = args.grow * args.n
        rows.append(row)
    finally:
        proc.stop()
    if not args.no_rabbit:
        pid = pid_listening_on(5672)
        args.keep = False
        try:
            rows.append(run_one("RabbitMQ", args.rabbit_url, pid or 0, args))
        except Exception as exc:  # not reachable: TrioMQ's figures alone
            print(f"RabbitMQ skipped: {exc!r}")
    print(f"n={args.n} size={args.size} window={args.window} grow={args.grow}")
    print("| broker | publish msg/s | CPU µs/msg | consume msg/s | CPU µs/msg | RSS MB at n |"
          " RSS MB at grow*n | restart s (empty / grow*n) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        restart = (f"{r['restart_empty_s']:.2f} / {r['restart_s']:.2f}" if "restart_s" in r
                   else "-")
        print(f"| {r['broker']} | {r['publish_rate']:,.0f} | {r['publish_cpu_us']:.0f} | "
              f"{r['consume_rate']:,.0f} | {r['consume_cpu_us']:.0f} | {r['rss_mb_at_n']:.0f} | "
              f"{r.get('rss_mb_at_grow', 0):.0f} | {restart} |")

if __name__ == "__main__":
    main()
