"""The store metadata seam (Store.save_meta / delete_meta, Broker.restore_meta) on every
store: records come back at recovery, newest value wins, deletes stick, metadata comes
back before queues (a vhost exists before its queues), and the journal keeps it across
checkpoints, dropped segments and a kill -9."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.persistence import MemoryStore, open_store
from broker.persistence.journal import JournalStore
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue

from .test_sql_store import _make_db

REPO = Path(__file__).resolve().parents[2]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable


def _life(store, data_dir, body, kinds=("test_vhost", "test_user", "test_policy")):
    """Open ``store``, recover into a broker recording what restore_meta hands back,
    run ``body(broker, restored)``, wait until durable, close. Returns the records."""
    restored: list = []

    async def main():
        await store.open()
        broker = Broker(Config(data_dir=str(data_dir)), store)
        for kind in kinds:
            def restorer(key, value, kind=kind):
                restored.append((kind, key, value))
                if kind == "test_vhost":
                    broker.create_vhost(key)
            broker.meta_restorers[kind] = restorer
        broker.recover()
        body(broker, restored)
        done = trio.Event()
        store.when_durable(done.set)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
    trio.run(main)
    return restored


def _durable_queue(vhost, name):
    q = Queue(vhost, name, durable=True, arguments={}, opts=parse_queue_arguments({}))
    vhost.add_queue(q)
    return q


def _contract(make_store, data_dir):
    def first(broker, restored):
        assert restored == []
        broker.store.save_meta("test_vhost", "v1", {"description": "one"})
        broker.store.save_meta("test_user", "ann", {"tags": ["a"]})
        broker.store.save_meta("test_user", "ann", {"tags": ["b"], "odd": "é\n/\x00"})  # replaces
        broker.store.save_meta("test_user", "bob/../x", {"n": 1})
        broker.store.save_meta("test_user", "bob/../x", {"n": 2})
        broker.store.delete_meta("test_user", "bob/../x")
        broker.store.delete_meta("test_user", "never-saved")
        broker.store.save_meta("unclaimed", "k", {"kept": True})
        _durable_queue(broker.create_vhost("v1"), "in-v1")
        with pytest.raises((TypeError, ValueError)):
            broker.store.save_meta("test_user", "bad", {"x": object()})
    _life(make_store(), data_dir, first)

    def second(broker, restored):
        assert ("test_vhost", "v1", {"description": "one"}) in restored
        assert ("test_user", "ann", {"tags": ["b"], "odd": "é\n/\x00"}) in restored
        assert not [r for r in restored if r[1] in ("bob/../x", "bad")]
        assert broker.unclaimed_meta == {("unclaimed", "k"): {"kept": True}}
        # the vhost came back first, so its queue could too
        assert "in-v1" in broker.vhosts["v1"].queues
        broker.store.delete_meta("test_vhost", "v1")
    _life(make_store(), data_dir, second)

    def third(broker, restored):
        assert [r[:2] for r in restored] == [("test_user", "ann")]
    _life(make_store(), data_dir, third)


def test_journal_meta_contract(tmp_path):
    _contract(lambda: JournalStore(str(tmp_path)), tmp_path)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_sql_meta_contract(kind, tmp_path):
    db = _make_db(kind)
    try:
        _contract(lambda: open_store(db.url, str(tmp_path)), tmp_path)
    finally:
        db.drop()


def test_memory_store_forgets_meta(tmp_path):
    store = MemoryStore()
    store.save_meta("test_user", "ann", {"x": 1})
    store.delete_meta("test_user", "ann")
    assert _life(store, tmp_path, lambda b, r: None) == []


def test_journal_meta_survives_checkpoints_and_dropped_segments(tmp_path):
    settings = JournalSettings(segment_size=64 * 1024, checkpoint_bytes=1 << 40)
    from broker.amqp.fields import encode_properties
    from broker.message import Message

    def first(broker, restored):
        broker.store.save_meta("test_policy", "/\x00p", {"pattern": ".*"})
        q = _durable_queue(broker.vhosts["/"], "q")
        props = {"delivery_mode": 2}
        for _ in range(40):  # fills several segments; all acked, so they can be dropped
            q.enqueue(Message("", "q", encode_properties(props), props, b"x" * 4000))
        while (e := q.get()) is not None:
            q.ack(e, None)
    _life(JournalStore(str(tmp_path), settings=settings), tmp_path, first)
    segs = sorted(os.listdir(tmp_path / "journal"))
    assert "00000001.log" not in segs  # the segment with the meta record is gone

    def second(broker, restored):
        assert restored == [("test_policy", "/\x00p", {"pattern": ".*"})]
        broker.store.save_meta("test_policy", "/\x00p", {"pattern": "^a"})
    _life(JournalStore(str(tmp_path), settings=settings), tmp_path, second)
    assert _life(JournalStore(str(tmp_path), settings=settings), tmp_path,
                 lambda b, r: None)[0][2] == {"pattern": "^a"}


def test_journal_meta_survives_kill_9(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time, trio
        from broker.persistence.journal import JournalStore
        async def main():
            store = JournalStore({str(tmp_path)!r})
            await store.open()
            store.recover(type("B", (), {{"vhosts": {{}}}})())
            for i in range(50):
                store.save_meta("test_user", f"u{{i}}", {{"i": i}})
            store.delete_meta("test_user", "u7")
            done = trio.Event()
            store.when_durable(done.set)
            async with trio.open_nursery() as n:
                n.start_soon(store.run)
                await done.wait()
                print("durable", flush=True)
                await trio.sleep(60)
        trio.run(main)
    """)
    proc = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, cwd=str(REPO))
    try:
        assert proc.stdout.readline().strip() == b"durable"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    restored = _life(JournalStore(str(tmp_path)), tmp_path, lambda b, r: None)
    assert {k for _, k, _ in restored} == {f"u{i}" for i in range(50)} - {"u7"}
    assert ("test_user", "u49", {"i": 49}) in restored


def test_journal_repair_keeps_meta(tmp_path):
    import io

    from broker.persistence.tools import inspect_journal, repair_journal

    def first(broker, restored):
        broker.store.save_meta("test_user", "ann", {"tags": ["x"]})
        broker.store.save_meta("test_vhost", "v", {})
        broker.store.delete_meta("test_vhost", "v")
    _life(JournalStore(str(tmp_path)), tmp_path, first)
    out = io.StringIO()
    assert inspect_journal(str(tmp_path), out) == 0
    assert repair_journal(str(tmp_path), io.StringIO()) == 0
    restored = _life(JournalStore(str(tmp_path)), tmp_path, lambda b, r: None)
    assert restored == [("test_user", "ann", {"tags": ["x"]})]
