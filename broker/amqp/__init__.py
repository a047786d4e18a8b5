"""Sans-IO AMQP 0-9-1: codec and connection/channel state machines (no sockets, no trio)."""
from . import spec
from .connection import ServerConnection

__all__ = ["ServerConnection", "spec"]
