"""A stream publish is confirmed only once the stream queue's definition is durable too:
the log has its own group commit, the definition is the store's (a confirmed message of a
stream whose definition a crash lost would be gone after the restart: 404)."""
from __future__ import annotations

import os

import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.message import Message
from broker.persistence.journal import JournalStore

S = {"x-queue-type": "stream"}


def _message(body: bytes) -> Message:
    props = {"delivery_mode": 2}
    return Message("", "kst", encode_properties(props), props, body)


def _life(path, body) -> None:
    """One broker life on the journal in ``path`` (no writer task: the test decides when the
    journal writes), ended as by kill -9: nothing more written, the lock released."""
    async def main():
        store = JournalStore(str(path))
        await store.open()
        broker = Broker(Config(data_dir=str(path)), store)
        broker.recover()
        await body(broker, store)
        for lg in list(broker.streams.logs.values()):
            lg.close()
        os.close(store._lock_fd)
    trio.run(main)


def test_a_stream_confirm_waits_for_its_definition_and_a_crash_keeps_both(tmp_path):
    confirmed = []

    async def first(broker, store):
        vhost = broker.vhosts["/"]
        q = vhost.declare_queue("kst", durable=True, arguments=S)
        assert q.enqueue(_message(b"m0"))
        q.when_durable(lambda: confirmed.append(0))
        # the log committed (no commit task: at once), the journal has not written yet
        assert q.log.durable_offset == 0
        assert confirmed == []

    _life(tmp_path, first)

    async def second(broker, store):
        # the crash lost the definition, and the unconfirmed message with it
        assert "kst" not in broker.vhosts["/"].queues
        q = broker.vhosts["/"].declare_queue("kst", durable=True, arguments=S)
        assert q.message_count == 0  # an earlier stream's files are not the new queue's
        assert q.enqueue(_message(b"m1"))
        q.when_durable(lambda: confirmed.append(1))
        assert confirmed == []
        await store._flush_once()  # the journal's group commit: the definition is durable
        assert confirmed == [1]
        assert q.enqueue(_message(b"m2"))
        q.when_durable(lambda: confirmed.append(2))
        assert confirmed == [1, 2]  # from then on, the log's commit alone

    _life(tmp_path, second)

    async def third(broker, store):
        q = broker.vhosts["/"].queues["kst"]
        assert q.message_count == 2

    _life(tmp_path, third)
