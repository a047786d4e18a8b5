"""Failed logins are logged naming the user, in RabbitMQ's words, while the client is told
nothing more than before: AMQP (pika), the management API and the Hermes frontend (httpx)."""
from __future__ import annotations

import logging

import httpx
import pika
import trio

from ..management.conftest import start_http_broker


def _amqp_login(port: int, user: str, password: str) -> str:
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        user, password), connection_attempts=1, socket_timeout=10)
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError as exc:
        return str(exc)
    return "accepted"


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_failed_logins_name_the_user(nursery, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    hb = await start_http_broker(nursery, tmp_path, hermes_port=0)
    async with hb.client() as api:
        r = await api.put("/api/users/clerk", json={"password": "c", "tags": ""})
        assert r.status_code == 201
    # AMQP: the client gets RabbitMQ's vague refusal, the log names user and cause
    answer = await trio.to_thread.run_sync(_amqp_login, hb.amqp_port, "guest", "wrong")
    assert "ACCESS_REFUSED" in answer and "guest" not in answer
    await trio.to_thread.run_sync(_amqp_login, hb.amqp_port, "nobody", "x")
    lines = _lines(caplog)
    assert any(line.startswith("PLAIN login refused: user 'guest' - invalid credentials")
               for line in lines), lines
    assert any(line.startswith("PLAIN login refused: user 'nobody' - invalid credentials")
               for line in lines), lines
    # management API: RabbitMQ's management plugin's line; a name cannot forge a log line
    async with hb.client("guest", "wrong") as c:
        assert (await c.get("/api/overview")).status_code == 401
    async with hb.client("evil\nPLAIN login refused: user 'x'", "x") as c:
        assert (await c.get("/api/overview")).status_code == 401
    async with hb.client("clerk", "c") as c:
        r = await c.get("/api/overview")
        assert r.status_code == 401 and r.json()["reason"] == "Not management user"
    lines = _lines(caplog)
    assert any(line.startswith("HTTP access denied: user 'guest' - invalid credentials")
               for line in lines), lines
    assert any(line.startswith("HTTP access denied: user 'clerk' - Not management user")
               for line in lines), lines
    assert not any("\n" in line for line in lines), lines
    assert any("user 'evil\\nPLAIN" in line for line in lines), lines
    # guest from elsewhere: refused on its loopback restriction, said in each protocol's words
    from broker.management.auth import login
    assert login(hb.broker.access, "guest", "guest", "10.1.2.3") is None
    assert hb.broker.access.login("PLAIN", b"\0guest\0guest", "10.1.2.3")[0] is None
    lines = _lines(caplog)
    assert any(line.startswith("HTTP access denied: user 'guest' - User can only log in via "
                               "localhost") for line in lines), lines
    assert any(line.startswith("PLAIN login refused: user 'guest' can only connect via "
                               "localhost") for line in lines), lines
    # the Hermes frontend checks the same credentials and logs the same way
    with trio.fail_after(10):
        await hb.broker.hermes.frontend.started.wait()
    port = hb.broker.hermes.frontend.port
    caplog.clear()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", auth=("writer", "w"),
                                 timeout=10) as c:
        assert (await c.post("/topics/g.t", content=b"{}")).status_code == 401
    assert any(line.startswith("HTTP access denied: user 'writer' - invalid credentials")
               for line in _lines(caplog)), _lines(caplog)
    await hb.server.shutdown()
