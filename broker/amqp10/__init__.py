"""AMQP 1.0, sans-IO: python-qpid-proton's engine (framing, type system, sessions, links,
credit, transfers) behind ``connection.ServerConnection``, with the SASL layer
(``sasl.py``) in front of it and RabbitMQ 4's address and message mappings in
``mapping.py``. Bytes in, events and bytes out; no trio, sockets or broker here."""
