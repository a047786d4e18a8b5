"""A Jepsen-style fault harness for TrioMQ (docs/cluster.md, "The fault harness").

Real processes on 127.0.0.1, real clients (pika), a real database: ``nodes`` runs the
brokers, ``workload`` the producers (unique ids, publisher confirms) and consumers (acks),
``nemesis`` injures the serving broker (kill -9, SIGSTOP), ``checker`` decides what was
lost, duplicated, or delivered without a confirm, and ``runner`` puts rounds together.
``python -m jepsen --help``.
"""
