"""An in-process broker with its HTTP listener on a free port, and an httpx client for it."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import MemoryStore


@dataclass
class HttpBroker:
    broker: Broker
    server: Server
    amqp_port: int
    http_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def client(self, user: str = "guest", password: str = "guest") -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, auth=(user, password), timeout=10)


async def start_http_broker(nursery, tmp_path, **config) -> HttpBroker:
    settings = dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"), http_port=0,
                    http_host="127.0.0.1", auth_failure_delay=0.01)
    settings.update(config)
    broker = Broker(Config(**settings), MemoryStore())
    server = Server(broker)
    amqp_port = await nursery.start(server.serve, "127.0.0.1", 0)
    with trio.fail_after(10):
        await broker.http_server.started.wait()
    return HttpBroker(broker, server, amqp_port, broker.http_server.port)


@pytest.fixture
async def http_broker(nursery, tmp_path) -> HttpBroker:
    hb = await start_http_broker(nursery, tmp_path)
    yield hb
    await hb.server.shutdown()


@pytest.fixture
async def api(http_broker):
    async with http_broker.client() as client:
        yield client
