"""``--workers 2``: a definition change is answered once every live process applied it, so
a client's next connection, whichever process it lands on, finds what it was told exists.
Real supervisor, real etcd, real pika and HTTP, each operation on a fresh connection."""
from __future__ import annotations

import base64
import json
import urllib.request

import pika
import pytest

from .test_workers import Workers, _by_process, _connect


def _request(w: Workers, method: str, path: str, data: dict | None = None) -> int:
    auth = base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{w.http}{path}", method=method,
        data=None if data is None else json.dumps(data).encode(),
        headers={"Authorization": f"Basic {auth}", "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status


@pytest.mark.timeout(180)
def test_declared_queue_seen_at_once_from_new_connections(tmp_path):
    w = Workers(tmp_path)
    conns = [_connect(w) for _ in range(20)]
    try:
        groups = _by_process(w, conns)
        assert all(groups.values()), {p: len(g) for p, g in groups.items()}
        (a, *_), others = groups.values()
        channels = [c.channel() for c in others + [c for c in conns if c not in others]]
        for i in range(5):
            # declared on one process, then at once (no waiting) seen by a passive declare on
            # every other connection, the other process's first
            a.channel().queue_declare(f"seen{i}", durable=True)
            for ch in channels:
                ch.queue_declare(f"seen{i}", passive=True)
    finally:
        for c in conns:
            if c.is_open:
                c.close()
        w.stop()


@pytest.mark.timeout(180)
def test_vhost_user_and_permissions_over_http_then_login(tmp_path):
    w = Workers(tmp_path)
    try:
        for i in range(4):  # each request a new HTTP connection: both processes answer some
            assert _request(w, "PUT", f"/api/vhosts/v{i}") == 201
            assert _request(w, "PUT", f"/api/users/u{i}",
                            {"password": "p", "tags": ""}) == 201
            assert _request(w, "PUT", f"/api/permissions/v{i}/u{i}",
                            {"configure": ".*", "write": ".*", "read": ".*"}) == 201
            for _ in range(6):  # no waiting: logins on both processes
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", w.port, f"v{i}", pika.PlainCredentials(f"u{i}", "p")))
                conn.channel().queue_declare("", exclusive=True)
                conn.close()
    finally:
        w.stop()


@pytest.mark.timeout(180)
def test_transient_queue_in_a_new_vhost_seen_at_once(tmp_path):
    w = Workers(tmp_path)
    conns = []
    try:
        assert _request(w, "PUT", "/api/vhosts/fresh") == 201  # made after the processes
        params = pika.ConnectionParameters("127.0.0.1", w.port, "fresh")
        conns = [pika.BlockingConnection(params) for _ in range(12)]
        groups = _by_process(w, conns)
        assert all(groups.values()), {p: len(g) for p, g in groups.items()}
        (a, *_), others = groups.values()
        channels = [c.channel() for c in others]
        for i in range(3):  # non-durable, shared: every process knows it at the declare-ok
            a.channel().queue_declare(f"t{i}")
            for ch in channels:
                ch.queue_declare(f"t{i}", passive=True)
    finally:
        for c in conns:
            if c.is_open:
                c.close()
        w.stop()
