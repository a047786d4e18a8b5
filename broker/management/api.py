"""The ``/api`` routes, gathered from one module per area."""
from __future__ import annotations

from . import api_overview


def add_routes(broker) -> None:
    routes: list = []
    for module in (api_overview,):
        routes.extend(module.routes())
    broker.http_routes.extend(routes)
