"""One Avro schema: parse once, validate bodies, convert JSON to Avro binary, check evolution.

Contract of ``AvroSchema``:

- ``AvroSchema(text)`` parses a schema given as JSON text (or an already decoded dict/list/str);
  raises ``SchemaError`` with one line (invalid JSON, invalid Avro) and owns nothing else.
- ``from_json(body)`` validates a JSON document and returns its Avro binary encoding;
  ``check_binary(body)`` validates an Avro binary body (schemaless, as Hermes and Confluent
  payloads without a header). Both raise ``ValidationFailed`` whose text names the failing
  field; neither keeps the body.
- ``to_json(body)`` decodes Avro binary back to a JSON-able value (push subscribers that want
  JSON).

``backward_problem(old, new)`` returns None when readers using ``new`` can read everything
written with ``old`` (Avro's schema resolution rules: Confluent's BACKWARD), else one line
naming the first field that breaks it.
"""
from __future__ import annotations

import io
import json
from functools import lru_cache
from typing import Any

# fastavro is imported by the methods, at the first schema: starting a broker does not need it

_MAX_JSON_DEPTH = 64


class SchemaError(ValueError):
    """The schema itself is invalid (one line)."""


class ValidationFailed(ValueError):
    """A body does not conform to the schema; ``str()`` names the field."""


def _full_name(schema: Any) -> str:
    if isinstance(schema, dict):
        name = schema.get("name", "")
        ns = schema.get("namespace")
        return f"{ns}.{name}" if ns and "." not in name else name
    return ""


class AvroSchema:
    __slots__ = ("_root", "definition", "parsed", "text")

    def __init__(self, text: Any):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "replace")
        if isinstance(text, str):
            try:
                definition = json.loads(text)
            except ValueError:
                # a bare primitive name ("string") is a valid schema too
                definition = text.strip()
        else:
            definition = text
        import fastavro
        try:
            self.parsed = fastavro.parse_schema(definition)
        except Exception as exc:  # fastavro raises several types for bad schemas
            raise SchemaError(f"invalid Avro schema: {exc}") from None
        self.definition = definition
        self.text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
        self._root = _full_name(self.parsed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AvroSchema) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def _field(self, path: str) -> str:
        root = self._root
        if root and path.startswith(root + "."):
            return path[len(root) + 1:]
        return path or "(root)"

    def validate(self, datum: Any) -> None:
        from fastavro.validation import ValidationError, validate
        try:
            validate(datum, self.parsed, raise_errors=True)
        except ValidationError as exc:
            errs = exc.errors
            if errs and hasattr(errs[0], "field"):
                e = errs[0]
                want = e.schema if isinstance(e.schema, str) else (
                    e.schema.get("type") if isinstance(e.schema, dict) else "union")
                got = "missing" if e.datum is None else f"{type(e.datum).__name__} {e.datum!r}"
                raise ValidationFailed(
                    f"field '{self._field(e.field)}': expected {want}, got {got}"[:400]) from None
            raise ValidationFailed(str(errs[0] if errs else exc)[:400]) from None

    def from_json(self, body: bytes) -> bytes:
        try:
            datum = json.loads(body)
        except ValueError as exc:
            raise ValidationFailed(f"invalid JSON: {exc}") from None
        except RecursionError:
            raise ValidationFailed("invalid JSON: nested too deeply") from None
        self.validate(datum)
        import fastavro
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, self.parsed, datum)
        except Exception as exc:  # a value validate() let through but the writer refuses
            raise ValidationFailed(f"cannot encode as Avro: {exc}") from None
        return out.getvalue()

    def check_binary(self, body: bytes) -> None:
        import fastavro
        buf = io.BytesIO(body)
        try:
            fastavro.schemaless_reader(buf, self.parsed, None)
        except (EOFError, StopIteration):
            raise ValidationFailed("invalid Avro binary: truncated body") from None
        except Exception as exc:
            raise ValidationFailed(f"invalid Avro binary: {exc}"[:400]) from None
        if buf.tell() != len(body):
            raise ValidationFailed(
                f"invalid Avro binary: {len(body) - buf.tell()} bytes after the record")

    def to_json(self, body: bytes) -> Any:
        import fastavro
        return fastavro.schemaless_reader(io.BytesIO(body), self.parsed, None)


@lru_cache(maxsize=256)
def compiled(text: str) -> AvroSchema:
    """The parsed schema for ``text`` (cached: exchanges keep their argument as text)."""
    return AvroSchema(text)


# ---- schema evolution (Avro resolution rules) ------------------------------------------
_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _type_name(s: Any) -> str:
    if isinstance(s, str):
        return s
    if isinstance(s, list):
        return "union"
    if isinstance(s, dict):
        t = s.get("type")
        if isinstance(t, (dict, list)):
            return _type_name(t)
        return t if isinstance(t, str) else "?"  # a logical type resolves as its base type
    return "?"


def _resolve(s: Any, named: dict) -> Any:
    """Replace a reference to a named type by its definition."""
    if isinstance(s, str) and s in named:
        return named[s]
    if isinstance(s, dict) and isinstance(s.get("type"), (dict, list)):
        return s["type"]
    return s


def _collect(s: Any, named: dict) -> None:
    if isinstance(s, list):
        for b in s:
            _collect(b, named)
    elif isinstance(s, dict):
        t = s.get("type")
        if t in ("record", "error", "enum", "fixed") and "name" in s:
            named[s["name"]] = s
        if t in ("record", "error"):
            for f in s.get("fields", []):
                _collect(f.get("type"), named)
        elif t == "array":
            _collect(s.get("items"), named)
        elif t == "map":
            _collect(s.get("values"), named)
        elif isinstance(t, (dict, list)):
            _collect(t, named)


def _readable(writer: Any, reader: Any, path: str, wn: dict, rn: dict) -> str | None:
    writer, reader = _resolve(writer, wn), _resolve(reader, rn)
    wt, rt = _type_name(writer), _type_name(reader)
    if wt == "union":
        for branch in writer:
            problem = _readable(branch, reader, path, wn, rn)
            if problem:
                return problem
        return None
    if rt == "union":
        if any(_readable(writer, b, path, wn, rn) is None for b in reader):
            return None
        return f"field '{path}': type {wt} is not in the new union"
    if wt in _PROMOTIONS or rt in _PROMOTIONS or wt in ("null", "boolean", "double"):
        if wt == rt or rt in _PROMOTIONS.get(wt, ()):
            return None
        return f"field '{path}': type changed from {wt} to {rt}"
    if wt != rt:
        return f"field '{path}': type changed from {wt} to {rt}"
    if wt == "array":
        return _readable(writer.get("items"), reader.get("items"), path + "[]", wn, rn)
    if wt == "map":
        return _readable(writer.get("values"), reader.get("values"), path + "{}", wn, rn)
    if wt == "enum":
        missing = [sym for sym in writer.get("symbols", []) if sym not in reader.get("symbols", [])]
        if missing and "default" not in reader:
            return f"field '{path}': enum symbol '{missing[0]}' removed"
        return None
    if wt == "fixed":
        if writer.get("size") != reader.get("size"):
            return f"field '{path}': fixed size changed"
        return None
    if wt in ("record", "error"):
        wfields = {f["name"]: f for f in writer.get("fields", [])}
        for f in reader.get("fields", []):
            name = f["name"]
            sub = f"{path}.{name}" if path else name
            old = wfields.get(name)
            if old is None:
                for alias in f.get("aliases", []):
                    old = wfields.get(alias)
                    if old is not None:
                        break
            if old is None:
                if "default" not in f:
                    return f"field '{sub}' was added without a default"
                continue
            problem = _readable(old.get("type"), f.get("type"), sub, wn, rn)
            if problem:
                return problem
        return None
    return None


def backward_problem(old: AvroSchema, new: AvroSchema) -> str | None:
    """None if ``new`` can read data written with ``old`` (BACKWARD), else why not."""
    wn: dict = {}
    rn: dict = {}
    _collect(old.definition, wn)
    _collect(new.definition, rn)
    problem = _readable(old.definition, new.definition, "", wn, rn)
    return f"schema is not backward compatible: {problem}" if problem else None
