"""What an introspection costs the broker is bounded whatever the endpoint or the clients
do: an endpoint that trickles its answer (each read within httpx's per-read timeout) fails
the login after ``INTROSPECTION_TIMEOUT`` in all; the cache's entries do not grow with the
tokens' size and a password longer than any opaque token is not sent to the endpoint; a
login waiting for another's request of the same token asks itself when that one was
cancelled (its connection closed). In-process, against an endpoint on a free port of
127.0.0.1 that this module runs."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trio

from broker.security import oauth2
from broker.security.oauth2 import OAuth2, OAuth2Config


class Endpoint:
    """``mode``: 'inactive' answers at once; 'trickle' sends its headers and then one octet
    of a long body every 0.1 s; 'gate' answers active once ``gate`` is set."""

    def __init__(self, mode: str):
        self.mode = mode
        self.asked: list[str] = []
        self.gate = threading.Event()
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.asked.append(self.path)
                if outer.mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    try:
                        while not outer.stop.wait(0.1):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    except OSError:
                        pass
                    return
                body = {"active": False}
                if outer.mode == "gate":
                    outer.gate.wait(60)
                    body = {"active": True, "username": "u", "exp": int(time.time() + 300),
                            "scope": "rabbitmq.read:*/*"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/introspect"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(request):
    ep = Endpoint(request.param)
    yield ep
    ep.close()


async def _until(condition) -> None:
    with trio.fail_after(30):
        while True:
            if condition():
                return
            await trio.sleep(0.01)


def _oauth(url: str) -> OAuth2:
    return OAuth2(OAuth2Config(resource_server_id="rabbitmq", introspection_url=url))


@pytest.mark.parametrize("endpoint", ["trickle"], indirect=True)
async def test_a_trickling_answer_ends_at_the_overall_timeout(endpoint, monkeypatch):
    monkeypatch.setattr(oauth2, "INTROSPECTION_TIMEOUT", 1.0)
    o = _oauth(endpoint.url)
    started = trio.current_time()
    with trio.fail_after(30):  # the trickle alone would take 100,000 s
        await o.introspect("opaque-trickled")
    assert trio.current_time() - started >= 1.0
    assert o.introspected_user("opaque-trickled") == (True, None)  # refused, cached
    assert not o.needs_introspection("opaque-trickled")


@pytest.mark.parametrize("endpoint", ["inactive"], indirect=True)
async def test_cache_entries_do_not_grow_with_the_token(endpoint):
    o = _oauth(endpoint.url)
    tokens = [f"{i:04d}" + "x" * (oauth2.OPAQUE_TOKEN_MAX - 4) for i in range(20)]
    for token in tokens:
        assert o.needs_introspection(token)
        await o.introspect(token)
        assert o.introspected_user(token) == (True, None)
    assert len(o.introspected) == 20
    assert sum(len(k) for k in o.introspected) <= 20 * 64
    # longer than any opaque token: a password, never sent to the endpoint
    assert not o.needs_introspection("y" * (oauth2.OPAQUE_TOKEN_MAX + 1))
    assert len(endpoint.asked) == 20


@pytest.mark.parametrize("endpoint", ["gate"], indirect=True)
async def test_a_waiting_login_asks_when_the_first_was_cancelled(endpoint):
    o = _oauth(endpoint.url)
    token = "opaque-shared"
    async with trio.open_nursery() as nursery:
        first = trio.CancelScope()

        async def first_login():
            with first:
                await o.introspect(token)

        nursery.start_soon(first_login)
        await _until(lambda: bool(endpoint.asked))
        second_done = trio.Event()

        async def second_login():
            await o.introspect(token)
            second_done.set()

        nursery.start_soon(second_login)
        pending = o._introspecting[oauth2._digest(token)]
        await _until(lambda: pending.statistics().tasks_waiting >= 1)  # waits on the first
        first.cancel()  # the first login's connection closed
        endpoint.gate.set()
        with trio.fail_after(30):
            await second_done.wait()
    known, user = o.introspected_user(token)
    assert known and user is not None and user.name == "u"
