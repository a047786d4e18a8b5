"""Streams: replayable append-only logs (``log.py``), read by AMQP 0-9-1 stream queues
(``queue.py``) and by the RabbitMQ Stream protocol (``broker/streamproto``)."""
