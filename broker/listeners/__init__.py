"""Listeners for protocols other than AMQP: the trio edge of each, wired to the one routing
core (vhosts, exchanges, queues). Each registers itself in ``broker.background_tasks``."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config


def mqtt_configured(config: Config) -> bool:
    """One of MQTT's ports is set (only then are its modules imported: a broker starts faster)."""
    return any(port is not None for port in (config.mqtt_port, config.mqtts_port,
                                             config.mqtt_ws_port, config.mqtt_wss_port))


def stomp_configured(config: Config) -> bool:
    """One of STOMP's ports is set (only then are its modules imported)."""
    return any(port is not None for port in (config.stomp_port, config.stomps_port,
                                             config.stomp_ws_port, config.stomp_wss_port))


class ListenError(Exception):
    """A listener could not open its port: one line for the command line."""
