"""The ``/api`` routes, gathered from one module per area."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import (
    api_access,
    api_connections,
    api_entities,
    api_overview,
    api_parameters,
    api_policies,
    api_super_streams,
    definitions,
    metrics,
)

if TYPE_CHECKING:
    from ..broker import Broker


def add_routes(broker: Broker) -> None:
    routes: list = []
    for module in (api_overview, api_entities, api_connections, api_access, api_policies,
                   api_parameters, definitions, api_super_streams):
        routes.extend(module.routes())
    routes.extend(metrics.routes(broker.services, broker.message_totals, broker.scheduler,
                                 lambda: broker.memory_limit))
    from ..cluster.members import routes as member_routes  # quorum members (cluster only)
    routes.extend(member_routes())
    from ..cluster.stream_members import routes as stream_member_routes  # stream replicas
    routes.extend(stream_member_routes())
    broker.http_routes.extend(routes)
