"""TrioMQ / RabbitMQ AMQP 0-9-1 load generator (`python -m bench`)."""
