"""``--workers 2``: the management API's connections, channels, consumers and overview
totals are the whole broker's from whichever process answers. Real supervisor, real
etcd, real pika, HTTP requests landing on both processes (SO_REUSEPORT)."""
from __future__ import annotations

import pytest

from .test_workers import Workers, _by_process, _connect, _known_on


@pytest.mark.timeout(180)
def test_listings_and_totals_are_every_process(tmp_path):
    w = Workers(tmp_path)
    conns = [_connect(w) for _ in range(10)]
    try:
        groups = _by_process(w, conns)
        assert all(groups.values()), {p: len(g) for p, g in groups.items()}
        first = conns[0].channel()
        first.queue_declare("mq", durable=True)
        first.confirm_delivery()
        for i in range(3):
            first.basic_publish("", "mq", str(i).encode())
        for c in {id(g[0]): g[0] for g in groups.values()}.values():
            _known_on(c, "mq", expect_locked=False)  # its definition came through etcd
        for i, c in enumerate(conns[1:]):  # 9 more channels, 4 consumers
            ch = c.channel()
            if i < 4:
                ch.basic_consume("mq", lambda *args: None)
        names = {c._impl._transport._sock.getsockname()[1] for c in conns}
        # each request is a new HTTP connection: 12 land on both processes
        for _ in range(12):
            listed = w.get("/api/connections")
            assert {c["peer_port"] for c in listed} == names, listed
            assert len(w.get("/api/channels")) == 10
            consumers = w.get("/api/consumers")
            assert len(consumers) == 4 and {c["queue"]["name"] for c in consumers} == {"mq"}
            totals = w.get("/api/overview")["object_totals"]
            assert (totals["connections"], totals["channels"], totals["consumers"]) == (10, 10, 4)
    finally:
        for c in conns:
            if c.is_open:
                c.close()
        w.stop()
