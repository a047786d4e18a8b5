"""Where the memory of never-acked persistent deliveries goes: a broker (journal store) in
this process under tracemalloc, ``--n`` persistent messages delivered to a consumer that
never acks; after the journal paged them out (4 s), the growth per delivery by source line.
``--paged``: the same messages left in the queue, no consumer, paged out past a 1 MiB
queue memory budget: what a paged queue's message costs (the target for an unacked one).

    .venv/bin/python -m bench.unacked_memory [--n 50000] [--size 1024] [--top 15] [--paged]
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
import tracemalloc

import trio

from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.listeners.amqp import Server
from broker.persistence import open_store

from .journal_memory import _blast, _consume_never_ack, _declare


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--trace", action="store_true", help="tracemalloc: growth by source line")
    p.add_argument("--paged", action="store_true",
                   help="no consumer: the messages stay in a paged queue (1 MiB budget)")
    args = p.parse_args(argv)
    data = tempfile.mkdtemp(prefix="triomq-unacked-")
    config = Config(host="127.0.0.1", port=0, data_dir=data, memory_limit_bytes=1 << 50,
                    disk_free_limit=0, heartbeat=0)
    settings = JournalSettings(queue_memory_budget=1 << 20) if args.paged else None
    broker = Broker(config, open_store("journal", data, journal=settings))
    server = Server(broker)
    port: list[int] = []
    up = threading.Event()
    stop = threading.Event()

    async def run_server():
        async with trio.open_nursery() as n:
            port.append(await n.start(server.serve, "127.0.0.1", 0))
            up.set()
            while not stop.is_set():  # noqa: ASYNC110
                await trio.sleep(0.2)
            await server.shutdown()
            n.cancel_scope.cancel()

    t = threading.Thread(target=trio.run, args=(run_server,), daemon=True)
    t.start()
    up.wait(30)
    url = f"amqp://guest:guest@127.0.0.1:{port[0]}/"
    _declare(url, "u")
    time.sleep(1.0)
    import ctypes
    import os
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)

    def rss() -> int:
        with open(f"/proc/{os.getpid()}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) * 1024
    base = rss()
    if args.trace:
        tracemalloc.start(1)
    before = tracemalloc.take_snapshot() if args.trace else None
    done = threading.Event()
    if args.paged:
        done.set()
    else:
        threading.Thread(target=_consume_never_ack, args=(url, "u", args.n, done),
                         daemon=True).start()
    _blast(url, "u", args.n, args.size)
    done.wait(600)
    time.sleep(4.0)
    grown = rss() - base
    libc.malloc_trim(0)
    trimmed = rss() - base
    what = "message in a paged queue" if args.paged else "delivery"
    print(f"RSS +{grown / args.n:.0f} B per {what} ({grown / args.n / args.size:.2f}x the "
          f"payload); {trimmed / args.n:.0f} B after malloc_trim(0)")
    if not args.trace:
        stop.set()
        t.join(30)
        return
    after = tracemalloc.take_snapshot()
    keep = [tracemalloc.Filter(True, "*/broker/*")]
    stats = after.filter_traces(keep).compare_to(before.filter_traces(keep), "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"{args.n} {'paged messages' if args.paged else 'never-acked deliveries'} of "
          f"{args.size} B: broker code allocated {total / args.n:.0f} B per {what} "
          f"(tracemalloc, live after 4 s)")
    for s in stats[:args.top]:
        fr = s.traceback[0]
        print(f"  {s.size_diff / args.n:7.1f} B  {s.count_diff / args.n:5.2f} blocks  "
              f"{fr.filename.split('/broker/')[-1]}:{fr.lineno}")
    stop.set()
    t.join(30)


if __name__ == "__main__":
    main()
