"""Batch audits of TrioMQ's audit trail on Spark (docs/audit.md).

``source`` reads the Avro files with the broker's tolerant reader inside Spark,
``jobs`` holds reconcile, sequence, latency, deadletters and track, ``report`` renders the
HTML report, ``cli`` is ``python -m spark.audit``.
"""
