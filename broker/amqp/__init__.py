"""Sans-IO AMQP 0-9-1: codec and connection/channel state machines (no sockets, no trio)."""
# builds first: it chooses the compiled or the pure build before the other modules load
from . import builds, spec  # isort: skip
from .connection import ServerConnection

__all__ = ["ServerConnection", "builds", "spec"]
