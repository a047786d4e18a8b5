"""Prometheus /metrics: one custom collector that reads the broker's state at scrape time
(no metric objects on the message path). RabbitMQ's names (rabbitmq_prometheus plugin) where
the meaning is the same; ``triomq_*`` for this broker's own.

As rabbitmq_prometheus: ``/metrics`` is aggregated (queue metrics summed, no vhost or queue
names) unless ``Config.metrics_per_object``; ``/metrics/per-object`` always labels each queue;
``/metrics/detailed?family=...&vhost=...`` serves only the families asked for, per object,
named ``rabbitmq_detailed_*``. Every endpoint carries ``rabbitmq_identity_info`` and
``rabbitmq_build_info``, which RabbitMQ's Grafana dashboards join every query on.
No login is asked unless ``Config.metrics_auth`` (then a user tagged monitoring or
administrator, 401 otherwise).
Here: the HTTP routes and the rendering; the collectors are in metrics_collectors, the
families in metrics_families."""
from __future__ import annotations

from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .auth import require
from .metrics_collectors import BrokerCollector, DetailedCollector
from .metrics_families import DETAILED_FAMILIES, PROTOCOL, RABBITMQ_VERSION

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..scheduler import Scheduler
    from ..services import MetricsServices
    from .stats import MessageTotals

__all__ = ["PROTOCOL", "RABBITMQ_VERSION", "BrokerCollector", "DetailedCollector", "routes"]


class _Snapshot:
    """Families already collected, for rendering away from the event loop."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


def _render(families: list) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    return generate_latest(registry)


async def render(collector) -> Response:
    """Read the broker's state on the event loop (the collector touches live objects), then
    format the text in a worker thread: with 10,000 queues per object, formatting is ~70 %
    of a scrape's time (bench/oauth2_metrics.py)."""
    families = list(collector.collect())
    body = await trio.to_thread.run_sync(_render, families)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def routes(services: MetricsServices, totals: MessageTotals, scheduler: Scheduler,
           memory_limit: Callable[[], int]) -> list:
    collectors = {per_object: BrokerCollector(services, totals, scheduler, memory_limit,
                                              per_object)
                  for per_object in (False, True)}
    config = services.config

    async def scrape(request: Request, per_object: bool) -> Response:
        if config.metrics_auth:
            await require(request, "monitoring")
        return await render(collectors[per_object])

    async def metrics(request: Request) -> Response:
        return await scrape(request, config.metrics_per_object)

    async def per_object(request: Request) -> Response:
        return await scrape(request, True)

    async def detailed(request: Request) -> Response:
        if config.metrics_auth:
            await require(request, "monitoring")
        families = {f for f in request.query_params.getlist("family") if f in DETAILED_FAMILIES}
        vhosts = set(request.query_params.getlist("vhost"))
        return await render(DetailedCollector(services, families, vhosts))

    return [Route("/metrics", metrics), Route("/metrics/per-object", per_object),
            Route("/metrics/detailed", detailed)]
