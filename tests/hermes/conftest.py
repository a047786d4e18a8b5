"""Fixtures: an in-process broker serving HTTP (management listener, Hermes routes) on a
journal store, a recording push endpoint, and an httpx client."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import open_store

from .endpoint import Endpoint


@dataclass
class HermesBroker:
    broker: Broker
    server: Server
    port: int
    http: httpx.AsyncClient
    stopped: trio.Event

    @property
    def hermes(self):
        return self.broker.hermes

    @property
    def vhost(self):
        return self.broker.vhosts["/"]


async def start_broker(nursery, data_dir, store: str | None = "journal") -> HermesBroker:
    config = Config(host="127.0.0.1", port=0, data_dir=str(data_dir), memory_limit_bytes=1 << 50,
                    disk_free_limit=0, heartbeat=0, http_port=0, hermes_port=0)
    data_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(config, open_store(store, str(data_dir)))
    server = Server(broker)
    stopped = trio.Event()

    async def serve(task_status=trio.TASK_STATUS_IGNORED):
        try:
            await server.serve("127.0.0.1", 0, task_status=task_status)
        finally:
            stopped.set()

    port = await nursery.start(serve)
    with trio.fail_after(10):
        await broker.http_server.started.wait()
        await broker.hermes.frontend.started.wait()
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{broker.http_server.port}", timeout=10,
                               auth=("guest", "guest"))
    return HermesBroker(broker, server, port, client, stopped)


async def stop_broker(hb: HermesBroker) -> None:
    await hb.http.aclose()
    await hb.server.shutdown()
    with trio.fail_after(10):
        await hb.stopped.wait()  # the store is closed: the data dir may be opened again


@pytest.fixture
async def hermes_broker(nursery, tmp_path):
    hb = await start_broker(nursery, tmp_path / "data")
    yield hb
    await stop_broker(hb)


@pytest.fixture
async def endpoint(nursery):
    ep = Endpoint()
    await nursery.start(ep.run)
    return ep
