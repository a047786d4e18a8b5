"""The RabbitMQ Stream protocol, sans-IO: frame codec (``codec``) and the server side of a
connection (``connection``). No sockets, clocks or broker here; the broker side is
``broker/listeners/stream_session.py``, the trio edge ``broker/listeners/stream.py``."""
