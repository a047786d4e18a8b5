"""TrioMQ: an AMQP 0-9-1 message broker on trio."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("triomq")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
