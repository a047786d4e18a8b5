"""Publishes that arrive while a write to the database is failing are in doubt, as the
journal's are: they were enqueued before the failure was known, so a consumer may already
hold them, and a nack ("not stored, never delivered") would be false. Several publishers
publish while the write in flight hangs on a silent database whose connections are then
reset and refused: none of them is nacked while the store retries, all are confirmed once
the database is back, and every message is there after a restart. Real PostgreSQL and
MariaDB behind ``faultproxy``; nothing mocked."""
from __future__ import annotations

import pytest
import trio

from .faultproxy import FaultProxy
from .test_sql_faults import TARGET
from .test_sql_store import Running, _make_db, declare_queue, message, run, take

PUBLISHERS = 4
EACH = 5


async def _until(cond, limit: float, what: str) -> None:
    with trio.fail_after(limit):
        while not cond():  # noqa: ASYNC110  (polls the store, no event to wait on)
            await trio.sleep(0.02)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_publishes_during_a_failing_write_are_never_nacked(kind):
    d = _make_db(kind)
    host, port = TARGET[kind]
    proxy = FaultProxy(host, port).start()
    url = d.url.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}")
    outcome: dict[bytes, bool] = {}

    async def main():
        async with Running(url) as r:
            store = r.store
            tries: list[bool] = []
            reconnect = store._reconnect

            async def counted() -> bool:  # counts the store's attempts, changes nothing
                ok = await reconnect()
                tries.append(ok)
                return ok
            store._reconnect = counted  # type: ignore[method-assign]
            q = declare_queue(r.broker, "q")
            q.enqueue(message("q", b"before"))
            assert await r.durable() is True

            def publish(body: bytes) -> None:  # as Channel.route_message: enqueue, then wait
                q.enqueue(message("q", body))
                store.when_durable(lambda: outcome.setdefault(body, True),
                                   lambda: outcome.setdefault(body, False))

            proxy.blackhole()
            publish(b"in flight")
            await _until(lambda: store._inflight, 10, "the write to start")
            # the write hangs: publishers go on, a consumer takes some of them
            for i in range(EACH):
                for p in range(PUBLISHERS):
                    publish(f"p{p}-{i}".encode())
            held = [take(q).message.body for _ in range(4)]
            assert held == [b"before", b"in flight", b"p0-0", b"p1-0"]
            proxy.close_all()
            proxy.refuse()
            await _until(lambda: store._down, 30, "the store to see the outage")
            await _until(lambda: len(tries) >= 3, 30, "three failed reconnects")
            nacked = sorted(b for b, ok in outcome.items() if not ok)
            assert not nacked, f"nacked, though enqueued (some delivered) before the failure: {nacked}"
            proxy.resume()
            await _until(lambda: not store._down and len(outcome) == 1 + PUBLISHERS * EACH,
                         60, "the store to write the batch again")
            assert all(outcome.values()), outcome
        async with Running(d.url) as r:
            q = r.vhost.queues["q"]
            bodies = sorted(e.message.body for e in q.ready.clear())
            want = [b"before", b"in flight"] + [f"p{p}-{i}".encode()
                                                for p in range(PUBLISHERS) for i in range(EACH)]
            assert bodies == sorted(want)
    try:
        run(main)
    finally:
        proxy.stop()
        d.drop()
