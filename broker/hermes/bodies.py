"""What a published body must be before a topic takes it (HTTP 400 ``VALIDATION_ERROR``
otherwise, the message starting ``Invalid message:`` as Hermes words it).

- JSON topic: the body is one JSON document. Hermes itself stores any bytes there (its
  consumers then fail to unwrap them); refusing at the door tells the producer instead.
- AVRO topic, JSON body: every key of every record is a field of the schema. fastavro's
  validator (and Hermes' default json-avro converter) ignore unknown keys, and the writer
  then drops them; json-avro-converter's ``FailOnUnknownField`` listener is the strict mode
  followed here, with its wording (``Field a.b is unknown``).
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes",
                         "string"))


def json_problem(body: bytes) -> str | None:
    """None when ``body`` is one JSON document, else why not (one line)."""
    try:
        json.loads(body)
    except RecursionError:
        return "invalid JSON: nested too deeply"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"invalid JSON: {exc}"[:300]
    return None


def _named(schema: Any, namespace: str | None, out: dict) -> None:
    """Every named type of ``schema`` by its full and its short name."""
    if isinstance(schema, list):
        for branch in schema:
            _named(branch, namespace, out)
        return
    if not isinstance(schema, dict):
        return
    t = schema.get("type")
    if t in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
        name = schema["name"]
        ns = schema.get("namespace", namespace)
        full = name if "." in name or not ns else f"{ns}.{name}"
        out.setdefault(full, schema)
        out.setdefault(name.rsplit(".", 1)[-1], schema)
        namespace = full.rsplit(".", 1)[0] if "." in full else ns
    if t in ("record", "error"):
        for f in schema.get("fields") or []:
            if isinstance(f, dict):
                _named(f.get("type"), namespace, out)
    elif t == "array":
        _named(schema.get("items"), namespace, out)
    elif t == "map":
        _named(schema.get("values"), namespace, out)
    elif isinstance(t, (dict, list)):
        _named(t, namespace, out)


def _unknown(schema: Any, datum: Any, named: dict, path: str, depth: int = 0) -> str | None:
    if depth > 200:  # a recursive schema walked by a datum deeper than any JSON body here
        return None
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return None
        schema = named.get(schema)
    if isinstance(schema, list):  # a union: fine if some branch of the datum's shape takes it
        first = None
        for branch in schema:
            resolved = named.get(branch, branch) if isinstance(branch, str) else branch
            kind = resolved.get("type") if isinstance(resolved, dict) else resolved
            if (isinstance(datum, dict) and kind in ("record", "error", "map")) or \
                    (isinstance(datum, list) and kind == "array"):
                problem = _unknown(resolved, datum, named, path, depth + 1)
                if problem is None:
                    return None
                first = first or problem
        return first
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, (dict, list)) or (isinstance(t, str) and t in named):
        return _unknown(t, datum, named, path, depth + 1)
    if t in ("record", "error") and isinstance(datum, dict):
        fields = {f.get("name"): f for f in schema.get("fields") or [] if isinstance(f, dict)}
        for key, value in datum.items():
            field = fields.get(key)
            where = f"{path}.{key}" if path else str(key)
            if field is None:
                return where
            problem = _unknown(field.get("type"), value, named, where, depth + 1)
            if problem:
                return problem
    elif t == "array" and isinstance(datum, list):
        for i, item in enumerate(datum):
            problem = _unknown(schema.get("items"), item, named, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
    elif t == "map" and isinstance(datum, dict):
        for key, value in datum.items():
            where = f"{path}.{key}" if path else str(key)
            problem = _unknown(schema.get("values"), value, named, where, depth + 1)
            if problem:
                return problem
    return None


@lru_cache(maxsize=256)
def _schema(text: str) -> tuple[Any, dict]:
    """The schema's definition and named types, once per schema text (topics keep theirs)."""
    definition = json.loads(text)
    named: dict = {}
    _named(definition, None, named)
    return definition, named


def unknown_field(schema: Any, body: bytes) -> str | None:
    """The path of the first key of the JSON ``body`` that no record of the Avro schema
    (its JSON text, or the parsed definition) has, or None (also when the body is not JSON:
    the schema's own validation names that)."""
    try:
        datum = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(schema, str):
        definition, named = _schema(schema)
    else:
        definition, named = schema, {}
        _named(definition, None, named)
    return _unknown(definition, datum, named, "")
