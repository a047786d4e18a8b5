"""Avro schemas (fastavro) for validated topics and exchanges.

``avro.AvroSchema`` parses a schema once and validates bodies (Avro binary or JSON,
converted to Avro binary as Hermes does); ``avro.backward_problem(old, new)`` checks
schema evolution; ``exchange`` is the AMQP side (the ``x-avro-schema`` exchange argument).
"""
from __future__ import annotations

from .avro import AvroSchema, SchemaError, ValidationFailed, backward_problem, compiled

__all__ = ["AvroSchema", "SchemaError", "ValidationFailed", "backward_problem", "compiled"]
