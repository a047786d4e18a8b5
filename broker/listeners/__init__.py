"""Listeners for protocols other than AMQP: the trio edge of each, wired to the one routing
core (vhosts, exchanges, queues). Each registers itself in ``broker.background_tasks``."""
from __future__ import annotations


class ListenError(Exception):
    """A listener could not open its port: one line for the command line."""
