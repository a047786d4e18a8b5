"""The machine's RabbitMQ as a reference broker, for the tests that compare with it.

Reachable means: AMQP answers on 5672 and the management API on 15672 says it is RabbitMQ.
A bare port check is not enough: where RabbitMQ's management plugin is off, 15672 is free
and a TrioMQ started without ``--http-port`` serves its own API there (its default port),
while RabbitMQ's AMQP listener may be down; both fooled the port checks once."""
from __future__ import annotations

import socket

import httpx
import pytest

HOST = "127.0.0.1"
AMQP_PORT = 5672
API = f"http://{HOST}:15672"


def amqp_up(host: str = HOST, port: int = AMQP_PORT) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def rabbitmq_api(base: str = API, timeout: float = 30, host: str = HOST) -> httpx.Client | None:
    """A client for RabbitMQ's management API at ``base`` (no ``/api`` suffix), or None when
    RabbitMQ is not what answers there or its AMQP port is down."""
    if not amqp_up(host):
        return None
    client = httpx.Client(base_url=base, auth=("guest", "guest"), timeout=timeout)
    try:
        r = client.get("/api/overview")
        if r.status_code == 200 and r.json().get("product_name") == "RabbitMQ":
            return client
    except (httpx.HTTPError, ValueError):
        pass
    client.close()
    return None


def require_rabbitmq_api(base: str = API, timeout: float = 30, host: str = HOST) -> httpx.Client:
    """As ``rabbitmq_api``, skipping the test when RabbitMQ is not there."""
    client = rabbitmq_api(base, timeout, host)
    if client is None:
        pytest.skip(f"RabbitMQ (AMQP on {host}:{AMQP_PORT}, management API on {base}) "
                    "is not reachable")
    return client
