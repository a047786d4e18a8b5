"""A real HTTP endpoint for push subscriptions: a raw ASGI app served by hypercorn's trio
worker inside the test's trio run, that records what it receives and answers as scripted
(status codes, delays, Retry-After)."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    status: int  # what the endpoint answered


@dataclass
class Endpoint:
    """``script``: answers consumed in order (an int status, or (status, delay_s[, headers]));
    then ``default``. ``ok`` holds the requests answered 2xx."""
    port: int = 0
    script: list = field(default_factory=list)
    default: int = 200
    received: list = field(default_factory=list)
    arrived: int = 0  # requests whose handling began (answered or not yet)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def ok(self) -> list:
        return [r for r in self.received if 200 <= r.status < 300]

    async def app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.arrived += 1
        self._changed.set()
        self._changed = trio.Event()
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        answer = self.script.pop(0) if self.script else self.default
        status, delay, extra = (answer, 0, {}) if isinstance(answer, int) else (
            answer[0], answer[1], answer[2] if len(answer) > 2 else {})
        if delay:
            await trio.sleep(delay)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.received.append(Received(scope["path"], headers, b"".join(chunks), status))
        self._changed.set()
        self._changed = trio.Event()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in extra.items()]})
        await send({"type": "http.response.body", "body": b""})

    async def wait_for(self, predicate, within: float = 10.0) -> None:
        with trio.fail_after(within):
            while not predicate(self):
                await self._changed.wait()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.port = free_port()
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.accesslog = None
        config.errorlog = None
        config.keep_alive_timeout = 30
        await serve(self.app, config, task_status=task_status)
