"""TrioMQ: an AMQP 0-9-1 message broker on trio."""
__version__ = "0.1.0"
