"""PySpark batch jobs of TrioMQ (``python -m spark.audit``)."""
