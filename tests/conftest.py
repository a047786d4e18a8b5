"""Fixtures for the broker's own tests: components on a fake clock, and an in-process server.

White-box first: ``vhost`` and ``broker`` are plain objects on a ``FakeClock`` (timers run
only when a test calls ``clock.advance``); ``session_client`` speaks AMQP to a broker
``Session`` without sockets. ``inprocess_broker`` runs the real trio server (listener,
connection tasks, timers) inside the test's own trio run, on 127.0.0.1 and a free port,
with a memory store.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server
from broker.persistence import MemoryStore
from broker.timers import TimerQueue
from broker.vhost import VirtualHost

from .support import FakeClock, SessionClient


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timers(clock) -> TimerQueue:
    clock.timers = TimerQueue(clock)
    return clock.timers


@pytest.fixture
def vhost(timers) -> VirtualHost:
    """A fresh virtual host '/' without a store, on the fake clock."""
    return VirtualHost("/", timers)


def _config(tmp_path, **kw) -> Config:
    # A memory limit no test process reaches: resource alarms must not block publishers.
    return Config(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                  memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0, **kw)


@pytest.fixture
def broker(tmp_path, clock) -> Broker:
    """A whole broker (vhost '/', users, scheduler hooks) with a MemoryStore, on the fake clock."""
    b = Broker(_config(tmp_path), MemoryStore())
    b.timers.now = clock
    clock.timers = b.timers
    return b


@pytest.fixture
def session_client(broker):
    """Factory: ``session_client(**kw) -> SessionClient`` connected to ``broker`` (handshake done).

    Connections still open at teardown are dropped as the server's edge would on EOF."""
    clients = []

    def make(**kw) -> SessionClient:
        c = SessionClient(broker, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.drop()


@dataclass
class InProcessBroker:
    broker: Broker
    server: Server
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"


@pytest.fixture
async def inprocess_broker(nursery, tmp_path) -> InProcessBroker:
    """The real server (``Server.serve``) in the test's nursery on 127.0.0.1, port chosen by the
    OS, with a MemoryStore and the real clock. Connect with ``support.TrioClient.connect(port)``.
    Shut down (connections closed with 320) after the test."""
    broker = Broker(_config(tmp_path), MemoryStore())
    server = Server(broker)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    yield InProcessBroker(broker, server, "127.0.0.1", port)
    await server.shutdown()
