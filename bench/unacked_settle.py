"""What settling long-held persistent deliveries costs: ``--n`` deliveries through a Session on
a journal store (fake clock), left unacked past two consumer-timeout sweeps, then settled at
once by an ack-multiple and, in a second broker, by closing the channel (all requeued).
Deliveries the pager would have left by location only are turned so first, as it does.

    .venv/bin/python -m bench.unacked_settle [--n 20000] [--size 1024]
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import trio

from broker.amqp import spec
from broker.amqp.codec import method_frame
from broker.broker import Broker
from broker.message import Message
from broker.persistence.journal import JournalStore
from tests.conftest import _config
from tests.support import FakeClock, SessionClient


def _run(how: str, n: int, size: int) -> float:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="triomq-settle-"))
    clock = FakeClock()
    store = JournalStore(str(tmp / "data"))
    b = Broker(_config(tmp), store)
    trio.run(store.open)
    b.recover()
    b.timers.now = clock
    clock.timers = b.timers
    c = SessionClient(b)
    c.open_channel(1)
    c.send(method_frame(1, spec.Queue.Declare(queue="q", durable=True)))
    trio.run(store._flush_once)
    c.output()
    for _ in range(n):
        c.publish(1, b"x" * size, routing_key="q", delivery_mode=2)
    trio.run(store._flush_once)
    c.consume(1, "q", tag="t")
    ch = c.session.channels[1]
    q = b.vhosts["/"].queues["q"]
    while len(ch.unacked) < n:
        c.conn.data_to_send()
        q.dispatch()
    c.output()
    clock.advance(1.1)
    clock.advance(1.1)
    for e in list(store._out):  # what the pager does to deliveries out for 1-2 s
        if e.loc and type(e.message) is Message:
            e.message = store._stored.of(e.message, e.loc)
    if how == "close":
        c.call(1, spec.Basic.Cancel("t"))
    t = time.perf_counter()
    if how == "ack":
        c.call(1, spec.Basic.Ack(0, True))
    else:
        c.call(1, spec.Channel.Close(200, "", 0, 0))
    took = time.perf_counter() - t
    assert q.unacked_count == 0
    trio.run(store.close)
    return took


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--size", type=int, default=1024)
    args = p.parse_args(argv)
    for how in ("ack", "close"):
        took = _run(how, args.n, args.size)
        print(f"{how}: {args.n} long-held deliveries settled in {took * 1000:.0f} ms "
              f"({took / args.n * 1e6:.1f} us each)")


if __name__ == "__main__":
    main()
