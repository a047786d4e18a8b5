"""A journal checkpoint taken on the event loop copies the queues' columns and nothing more:
the CRC of a queue's record is computed by the writer thread, and a column made of several
pieces (entries in memory, the paged index, unsettled deliveries) is written piece by
piece. What comes back after a restart from it is every entry, in order, with its
delivery count -- for a FIFO queue and a paged priority queue."""
from __future__ import annotations

import zlib

import trio

from broker.amqp.fields import encode_properties
from broker.message import Message
from broker.persistence import journal_format as jf

from .test_compaction import BODY, Harness
from .test_store_contract import durable_queue, message

N = 300


def _prio_message(body: bytes, priority: int) -> Message:
    props = {"delivery_mode": 2, "priority": priority}
    return Message("", "p", encode_properties(props), props, body)


def _drain(q) -> list[tuple[bytes, int, int]]:
    out = []
    while q.message_count:
        e = q.get()
        out.append((bytes(e.message.body[:6]), e.delivery_count, e.priority or 0))
        q.ack(e, None)
    return out


def test_checkpoint_pieces_round_trip_and_no_crc_on_the_loop(tmp_path, monkeypatch):
    crc_bytes_in_snapshot = []

    async def main():
        # a small memory budget: most of each queue is paged (index only)
        h = Harness(tmp_path, queue_memory_budget=20 * BODY)
        await h.start()
        fifo = h.queue()
        prio = durable_queue(h.broker, "p", arguments={"x-max-priority": 5})
        for i in range(N):
            fifo.enqueue(message(b"%06d" % i + b"." * (BODY - 6)))
            prio.enqueue(_prio_message(b"%06d" % i + b"." * (BODY - 6), i % 6))
            if i % 20 == 0:
                await h.store._flush_once()
        await h.store._flush_once()
        # two deliveries left unsettled: checkpointed as delivered, back redelivered
        held = [fifo.get(), fifo.get()]
        assert [bytes(e.message.body[:6]) for e in held] == [b"000000", b"000001"]
        await h.store._flush_once()

        real_crc = zlib.crc32
        real_snapshot = h.store._snapshot

        def counting_crc(data, value=0):
            crc_bytes_in_snapshot.append(memoryview(data).nbytes)
            return real_crc(data, value)

        def snapshot():
            monkeypatch.setattr(jf.zlib, "crc32", counting_crc)
            try:
                return real_snapshot()
            finally:
                monkeypatch.setattr(jf.zlib, "crc32", real_crc)

        h.store._snapshot = snapshot
        await h.store.checkpoint()
        await h.store.close()

    trio.run(main)
    # only the small records (head, definitions) are packed on the event loop
    print("bytes CRCed on the event loop:", sum(crc_bytes_in_snapshot))
    assert sum(crc_bytes_in_snapshot) < 4096, sum(crc_bytes_in_snapshot)

    async def after():
        h = Harness(tmp_path, queue_memory_budget=20 * BODY)
        await h.start()
        fifo = h.broker.vhosts["/"].queues["q"]
        prio = h.broker.vhosts["/"].queues["p"]
        got = _drain(fifo), _drain(prio)
        await h.store.close()
        return got

    fifo_got, prio_got = trio.run(after)
    assert [b for b, _c, _p in fifo_got] == [b"%06d" % i for i in range(N)]
    # the two held back redelivered (count 1), +1 for this drain
    assert [c for _b, c, _p in fifo_got[:3]] == [2, 2, 1]
    want = sorted(range(N), key=lambda i: (-(i % 6), i))
    assert [b for b, _c, _p in prio_got] == [b"%06d" % i for i in want]
