"""Quorum queue priorities on the SQL stores (SQLite, PostgreSQL, MariaDB): the two
levels (0-4 normal, 5+ high) come back from the stored priority column after a restart
and drain in RabbitMQ 4's 2:1 order."""
from __future__ import annotations

from ..queues.test_quorum_priority import PRIOS, model
from .test_sql_store import Running, db, declare_queue, message, run  # noqa: F401 - db fixture

Q = {"x-queue-type": "quorum"}


def drain(q) -> list[bytes]:
    out = []
    while (e := q.get()) is not None:
        out.append(e.message.body)
        q.ack(e, None)
    return out


def test_quorum_priorities_survive_restart(db):  # noqa: F811 - the fixture
    async def first():
        async with Running(db.url) as r:
            q = declare_queue(r.broker, "qq", arguments=Q)
            for i, p in enumerate(PRIOS):
                q.enqueue(message("qq", b"m%02d" % i, **({} if p is None else {"priority": p})))
            assert await r.durable()

    async def second():
        async with Running(db.url) as r:
            return drain(r.vhost.queues["qq"])

    run(first)
    assert run(second) == model(PRIOS)
