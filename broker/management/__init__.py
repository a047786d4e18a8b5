"""Management: RabbitMQ-compatible HTTP API, Prometheus metrics and the web console, served
in the broker process (docs/management.md).

``install(broker)`` creates the HTTP listener (``broker.http_server``) and adds this package's
routes to ``broker.http_routes``; other features append their own starlette ``Route``/``Mount``
objects to that list at their install time (the app is built when the listener starts).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from .http import ApiError, HttpServer

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["ApiError", "HttpServer", "install"]


def install(broker: Broker) -> HttpServer:
    from . import api
    from .stats import MessageTotals, Sampler

    server = HttpServer(broker)
    broker.http_server = server
    broker.amqp_listening = trio.Event()  # set once AMQP listens (the HTTP port binds then)

    def amqp_listening(port: int) -> None:
        server.amqp_port = port
        broker.amqp_listening.set()

    broker.on_amqp_listening = amqp_listening  # called by server.Server.serve
    broker.message_totals = MessageTotals(broker)  # channels fold their counters in at close
    broker.stats_sampler = Sampler(broker)
    api.add_routes(broker)
    if broker.config.http_port is not None:
        broker.early_tasks.append(server.run)  # answers during recovery (progress)
        broker.background_tasks.append(broker.stats_sampler.run)
    return server
