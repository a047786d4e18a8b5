"""Hermes-style HTTP publishing and push subscriptions on the broker's routing core.

``install(broker)``: ``broker.hermes`` (``service.Hermes``), its routes appended to
``broker.http_routes`` (served by the management HTTP listener), its push subscribers'
nursery as a background task, its clean stop in ``broker.drain_hooks`` (awaited by the
server's shutdown before the store closes), its stored definitions claimed at recovery
(``broker.meta_restorers``), and a publish hook validating AMQP publishes to AVRO topics.
Modules: ``model`` (definitions, validation), ``service`` (topics, subscriptions, publish),
``push`` (the push subscriber), ``client`` (its HTTP/1.1 connections), ``http``
(routes on the management port), ``frontend`` (the lean publishing listener,
--hermes-port). See docs/hermes.md.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import HermesServices
    from .model import HermesError, SubscriptionDef, TopicDef
    from .service import Hermes

__all__ = ["Hermes", "HermesError", "SubscriptionDef", "TopicDef", "install"]

# Loaded on first use, not with the package: ``broker ctl`` imports ``broker.hermes.ctl``, and
# that short-lived process has no use for the routes, the Avro schemas and the service.
_LAZY = {"Hermes": "service", "HermesError": "model", "SubscriptionDef": "model", "TopicDef": "model"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def install(broker: Broker, services: HermesServices) -> Hermes:
    """Hermes on the root's ``services``, wired into ``broker``'s routes, tasks, hooks and
    restorers; ``Broker.__init__`` keeps it as ``broker.hermes``."""
    from . import http
    from .frontend import Frontend
    from .service import SUBSCRIPTION_KIND, TOPIC_KIND, Hermes

    hermes = Hermes(services)
    broker.http_routes.extend(http.routes(hermes))
    broker.background_tasks.append(hermes.run)
    broker.drain_hooks.append(hermes.drain)
    config = broker.config
    if config.hermes_port is not None:
        host = config.hermes_host if config.hermes_host is not None else config.host
        hermes.frontend = Frontend(hermes, host, config.hermes_port, broker.http_server.bodies)
        broker.background_tasks.append(hermes.frontend.run)
    broker.meta_restorers[TOPIC_KIND] = hermes.restore_topic
    broker.meta_restorers[SUBSCRIPTION_KIND] = hermes.restore_subscription
    broker.publish_hooks.append(hermes.publish_hook)
    return hermes
