"""Avro schemas (broker/schemas): validation naming the field, JSON -> Avro binary,
backward compatibility, and Avro-validated exchanges over AMQP (x-avro-schema)."""
from __future__ import annotations

import io
import json

import fastavro
import pytest

from broker.amqp import spec
from broker.schemas import AvroSchema, SchemaError, ValidationFailed, backward_problem

from ..support import channel_close, methods

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "address", "type": {"type": "record", "name": "Address",
                                 "fields": [{"name": "city", "type": "string"}]}},
]}
GOOD = {"id": "o-1", "qty": 2, "address": {"city": "Kraków"}}


def avro_bytes(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_json_is_validated_and_converted():
    s = AvroSchema(json.dumps(ORDER))
    binary = s.from_json(json.dumps(GOOD).encode())
    assert binary == avro_bytes(ORDER, GOOD)
    assert s.to_json(binary) == GOOD
    s.check_binary(binary)


@pytest.mark.parametrize("body, field", [
    ({"id": "o", "qty": "two", "address": {"city": "x"}}, "qty"),
    ({"id": "o", "address": {"city": "x"}}, "qty"),
    ({"id": "o", "qty": 1, "address": {"city": 5}}, "city"),
])
def test_invalid_json_names_the_field(body, field):
    with pytest.raises(ValidationFailed, match=f"field '[^']*{field}'"):
        AvroSchema(ORDER).from_json(json.dumps(body).encode())


def test_bad_binary_and_bad_schema():
    s = AvroSchema(ORDER)
    good = avro_bytes(ORDER, GOOD)
    with pytest.raises(ValidationFailed, match="truncated"):
        s.check_binary(good[:-2])
    with pytest.raises(ValidationFailed, match="after the record"):
        s.check_binary(good + b"\x00")
    with pytest.raises(ValidationFailed, match="invalid JSON"):
        s.from_json(b"{nope")
    with pytest.raises(SchemaError):
        AvroSchema('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}')


def test_backward_compatibility():
    old = AvroSchema(ORDER)
    added_default = dict(ORDER, fields=[*ORDER["fields"], {"name": "note", "type": ["null", "string"],
                                                           "default": None}])
    assert backward_problem(old, AvroSchema(added_default)) is None
    removed = dict(ORDER, fields=ORDER["fields"][:2])  # readers may ignore a writer's field
    assert backward_problem(old, AvroSchema(removed)) is None
    promoted = dict(ORDER, fields=[ORDER["fields"][0], {"name": "qty", "type": "long"},
                                   ORDER["fields"][2]])
    assert backward_problem(old, AvroSchema(promoted)) is None
    no_default = dict(ORDER, fields=[*ORDER["fields"], {"name": "note", "type": "string"}])
    assert "'note' was added without a default" in backward_problem(old, AvroSchema(no_default))
    narrowed = dict(ORDER, fields=[ORDER["fields"][0], {"name": "qty", "type": "string"},
                                   ORDER["fields"][2]])
    assert "'qty'" in backward_problem(old, AvroSchema(narrowed))


# ---- AMQP: the x-avro-schema exchange argument ------------------------------------------------
def _declare(c, schema=ORDER):
    c.ok(1, spec.Exchange.Declare(exchange="orders", type="fanout",
                                  arguments={"x-avro-schema": json.dumps(schema)}),
         spec.Exchange.DeclareOk)
    c.declare_queue(1, "orders-q")
    c.ok(1, spec.Queue.Bind(queue="orders-q", exchange="orders"), spec.Queue.BindOk)


def test_exchange_validates_publishes(session_client, broker):
    c = session_client()
    c.open_channel(1)
    _declare(c)
    assert c.publish(1, avro_bytes(ORDER, GOOD), exchange="orders") == []
    assert c.publish(1, json.dumps(GOOD).encode(), exchange="orders",
                     content_type="application/json") == []
    q = broker.vhosts["/"].queues["orders-q"]
    assert q.message_count == 2
    close = channel_close(c.publish(1, json.dumps({"id": "x"}).encode(), exchange="orders",
                                    content_type="application/json"))
    assert close.reply_code == 406
    assert "Avro schema of exchange 'orders' in vhost '/'" in close.reply_text
    assert "field 'qty'" in close.reply_text
    assert q.message_count == 2


def test_exchange_nacks_in_confirm_mode(session_client, broker):
    c = session_client()
    c.open_channel(1)
    _declare(c)
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    written = c.publish(1, b"\x01\x02garbage", exchange="orders")
    written += c.publish(1, avro_bytes(ORDER, GOOD), exchange="orders")
    assert [(type(m).__name__, m.delivery_tag) for m in methods(written)] == [("BasicNack", 1), ("BasicAck", 2)]
    assert broker.vhosts["/"].queues["orders-q"].message_count == 1


def test_invalid_schema_argument_is_refused(session_client):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.call(1, spec.Exchange.Declare(
        exchange="bad", type="fanout", arguments={"x-avro-schema": '{"type": "record"}'})))
    assert close.reply_code == 406
    assert close.reply_text.startswith(
        "PRECONDITION_FAILED - invalid arg 'x-avro-schema' for exchange 'bad' in vhost '/': invalid Avro schema")


def test_policy_key_validates_exchanges(session_client, broker):
    from broker.policies.validate import PolicyError
    c = session_client()
    c.open_channel(1)
    c.ok(1, spec.Exchange.Declare(exchange="events.in", type="fanout"), spec.Exchange.DeclareOk)
    c.declare_queue(1, "events-q")
    c.ok(1, spec.Queue.Bind(queue="events-q", exchange="events.in"), spec.Queue.BindOk)
    assert c.publish(1, b"anything", exchange="events.in") == []  # no schema yet
    broker.policies.set_policy("/", "avro", "^events\\.", {"avro-schema": json.dumps(ORDER)},
                               apply_to="exchanges")
    assert c.publish(1, avro_bytes(ORDER, GOOD), exchange="events.in") == []
    close = channel_close(c.publish(1, b"anything", exchange="events.in"))
    assert close.reply_code == 406 and "Avro schema of exchange 'events.in'" in close.reply_text
    assert broker.vhosts["/"].queues["events-q"].message_count == 2
    with pytest.raises(PolicyError, match="invalid Avro schema"):
        broker.policies.set_policy("/", "bad", ".*", {"avro-schema": "{\"type\": \"nope\"}"})


def test_policy_schema_change_is_checked_for_backward_compatibility(broker):
    from broker.policies.validate import PolicyError
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("orders.in", "fanout")
    broker.policies.set_policy("/", "avro", "^orders\\.", {"avro-schema": json.dumps(ORDER)},
                               apply_to="exchanges")
    added_default = dict(ORDER, fields=ORDER["fields"] + [
        {"name": "note", "type": "string", "default": ""}])
    broker.policies.set_policy("/", "avro", "^orders\\.", {"avro-schema": json.dumps(added_default)},
                               apply_to="exchanges")  # a field with a default: backward compatible
    no_default = dict(ORDER, fields=ORDER["fields"] + [{"name": "prio", "type": "int"}])
    with pytest.raises(PolicyError, match=r"exchange 'orders\.in'.*prio"):
        broker.policies.set_policy("/", "avro", "^orders\\.", {"avro-schema": json.dumps(no_default)},
                                   apply_to="exchanges")
    with pytest.raises(PolicyError, match="not backward compatible"):  # another policy, same target
        broker.policies.set_policy("/", "avro2", "^orders\\.in$",
                                   {"avro-schema": json.dumps(no_default)}, priority=5,
                                   apply_to="exchanges")
    # a lower-priority policy does not replace the schema: nothing to check
    broker.policies.set_policy("/", "low", "^orders\\.in$", {"avro-schema": json.dumps(no_default)},
                               priority=-1, apply_to="exchanges")
    x = vhost.exchanges["orders.in"]
    assert json.loads(x.effective_policy_definition["avro-schema"]) == added_default
