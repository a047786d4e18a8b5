"""rawamqp: an AMQP 0-9-1 client written from the spec, independent of ``broker/``.

One implementation of the wire format for the interop tests and the benchmark, so that
both hold TrioMQ against a second opinion rather than against its own codec:

* ``rawamqp.codec``      frames, method ids, strings, field tables/arrays (RabbitMQ's type
                         tags), basic properties, body splitting, stream splitting;
* ``rawamqp.client``     ``RawAMQP``: blocking, permissive, step-by-step (interop tests);
* ``rawamqp.connection`` ``Connection``: blocking, handshakes itself, slow-path RPCs, its
                         socket handed to the benchmark's hot loops.

Everything is re-exported here: ``import rawamqp; rawamqp.table({...})``.
"""
import time  # noqa: F401  (re-exported: interop tests use rawamqp.time.monotonic())

from . import codec
from .client import Closed, RawAMQP, SocketClient
from .codec import *  # noqa: F403
from .connection import AMQPError, ChannelClosed, Connection, Method, parse_url

_Reader = Reader  # noqa: F405  (the benchmark's historical name)

__all__ = [
    "AMQPError",
    "ChannelClosed",
    "Closed",
    "Connection",
    "Method",
    "RawAMQP",
    "SocketClient",
    "parse_url",
]
__all__ += codec.__all__
