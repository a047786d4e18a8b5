"""A Jepsen-style fault harness for TrioMQ (docs/cluster.md, "The fault harness").

Real processes on 127.0.0.1 (or each host in its own network namespace: ``netns``), real
clients (pika), a real database or etcd: ``nodes`` runs the brokers, ``workload`` the
producers (unique ids, publisher confirms) and consumers (acks), ``nemesis`` injures the
serving broker (kill -9, SIGSTOP), ``checker`` decides what was lost, duplicated, or
delivered without a confirm, ``runner`` puts rounds together; ``mirrored`` does the same on
an etcd cluster with mirrored queues, with network faults too.
``python -m jepsen --help``.
"""
