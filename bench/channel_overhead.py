"""In-process cost of the channel's publish -> deliver -> ack path (no sockets, no trio):
one Session, a consumer with acks on a queue, N small messages published in batches of 100
and acked with multiple=true. Prints messages per CPU second (process time, steadier than
wall time on a shared machine; median of ``--runs``).

    .venv/bin/python -m bench.channel_overhead --messages 100000 --runs 5

Run from a tree's root; compares trees (e.g. a git worktree of an older commit) on one machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

from broker.amqp import spec
from broker.amqp.codec import method_frame
from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp_session import Session
from broker.persistence import MemoryStore
from tests.amqp.sansio_helpers import GUEST_PLAIN, HEADER, conn_open, start_ok, tune_ok
from tests.support import publish_frames


def run_once(n: int, batch: int = 100) -> float:
    broker = Broker(Config(), MemoryStore())
    s = Session(broker, "127.0.0.1:1", "127.0.0.1")
    s.wake = lambda: None
    for data in (HEADER, start_ok("PLAIN", GUEST_PLAIN, {}), tune_ok(), conn_open("/"),
                 method_frame(1, spec.Channel.Open()),
                 method_frame(1, spec.Queue.Declare(queue="q")),
                 method_frame(1, spec.Basic.Consume(queue="q", consumer_tag="c"))):
        s.data_received(data)
    s.conn.data_to_send()
    one = publish_frames(1, b"x" * 16, routing_key="q", properties={"content_type": "text/plain"})
    chunk = one * batch
    tag = 0
    t0 = time.process_time()
    for _ in range(n // batch):
        s.data_received(chunk)
        tag += batch
        s.data_received(method_frame(1, spec.Basic.Ack(tag, True)))
        s.conn.data_to_send()
    elapsed = time.process_time() - t0
    assert broker.vhosts["/"].queues["q"].message_count == 0
    return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rates = [run_once(args.messages) for _ in range(args.runs)]
    print(f"median {statistics.median(rates):,.0f} msg/CPU-s  runs "
          + " ".join(f"{r:,.0f}" for r in rates))


if __name__ == "__main__":
    main()
