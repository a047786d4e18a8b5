"""Management: RabbitMQ-compatible HTTP API, Prometheus metrics and the web console, served
in the broker process (docs/management.md).

``install(broker, services)`` creates the HTTP listener (``broker.http_server``), the message
totals and the sampler on the typed ``services`` (``services.StatsServices``), and adds this
package's routes to ``broker.http_routes`` (the API's handlers are the HTTP edge: they reach
the broker through the app's state, as the protocol sessions do); other features append their
own starlette ``Route``/``Mount`` objects to that list at their install time (the app is built
when the listener starts).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import trio

from .http import ApiError, HttpServer, build_app

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import Services

__all__ = ["ApiError", "HttpServer", "install"]


def install(broker: Broker, services: Services) -> HttpServer:
    from . import api
    from .stats import MessageTotals, Sampler

    broker.amqp_listening = trio.Event()  # set once AMQP listens (the HTTP port binds then)
    server = HttpServer(services.config, services.recovery, broker.amqp_listening,
                        partial(build_app, broker))
    broker.http_server = server

    def amqp_listening(port: int) -> None:
        server.amqp_port = port
        broker.amqp_listening.set()

    broker.on_amqp_listening = amqp_listening  # called by server.Server.serve
    # channels fold their counters in at close
    broker.message_totals = MessageTotals(services)
    broker.stats_sampler = Sampler(services, broker.message_totals)
    api.add_routes(broker)
    if broker.config.http_port is not None:
        broker.early_tasks.append(server.run)  # answers during recovery (progress)
        broker.background_tasks.append(broker.stats_sampler.run)
    return server
