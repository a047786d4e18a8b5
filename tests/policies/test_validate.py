"""Policy validation apart from behaviour: RabbitMQ 3.10's texts (checked against its
management API on this machine), each naming the offending key."""
from __future__ import annotations

import pytest

from broker.policies import MissingKey, PolicyError, parse_policy, validate_definition


@pytest.mark.parametrize("definition, key, text", [
    ({"foo": 1}, "foo", '[{<<"foo">>,1}] are not recognised policy settings'),
    ({"max-length": 1, "foo": 2, "bar": 3}, "bar",
     '[{<<"bar">>,3},{<<"foo">>,2}] are not recognised policy settings'),
    ({"message-ttl": "a"}, "message-ttl", '<<"a">> is not a valid message TTL'),
    ({"message-ttl": -1}, "message-ttl", "-1 is not a valid message TTL"),
    ({"message-ttl": 1.0}, "message-ttl", "1.0 is not a valid message TTL"),
    ({"max-length": 1.5}, "max-length", "1.5 is not a valid maximum length"),
    ({"max-length": True}, "max-length", "true is not a valid maximum length"),
    ({"max-length-bytes": -1}, "max-length-bytes", "-1 is not a valid maximum length in bytes"),
    ({"expires": 0}, "expires", "0 is not a valid queue expiry"),
    ({"expires": "1"}, "expires", '<<"1">> is not a valid queue expiry'),
    ({"message-ttl": 1, "max-length": -1, "expires": -2}, "expires",
     "-2 is not a valid queue expiry"),
    ({"overflow": "x"}, "overflow", '<<"x">> is not a valid overflow value'),
    ({"overflow": 1}, "overflow", "1 is not a valid overflow value"),
    ({"dead-letter-exchange": 1}, "dead-letter-exchange",
     "1 is not a valid dead letter exchange name"),
    ({"dead-letter-routing-key": 1}, "dead-letter-routing-key",
     "1 is not a valid dead letter routing key"),
    ({"delivery-limit": -1}, "delivery-limit", "-1 is not a valid delivery limit"),
    ({"alternate-exchange": 5}, "alternate-exchange", "5 is not a valid alternate exchange name"),
    ({"queue-master-locator": "foo"}, "queue-master-locator",
     '<<"foo">> invalid queue-master-locator value'),
    ({"queue-mode": "x"}, "queue-mode", '<<"x">> is not a valid queue-mode value'),
    ({"ha-mode": "foo"}, "ha-mode", 'ha-mode: <<"foo">> is not a valid ha-mode value'),
    ({"ha-mode": "exactly"}, "ha-params", 'ha-params: ha-mode="exactly" takes an integer, none given'),
    ({"ha-mode": "exactly", "ha-params": 0}, "ha-params",
     'ha-params: ha-mode="exactly" takes an integer, 0 given'),
    ({"ha-mode": "exactly", "ha-params": "2"}, "ha-params",
     'ha-params: ha-mode="exactly" takes an integer, <<"2">> given'),
    ({"ha-mode": "nodes", "ha-params": [1]}, "ha-params",
     'ha-params: ha-mode="nodes" takes a list of strings, [1] was not a string'),
    ({"ha-mode": "nodes", "ha-params": "a"}, "ha-params",
     'ha-params: ha-mode="nodes" takes a list, <<"a">> given'),
    ({"ha-mode": "nodes", "ha-params": []}, "ha-params", 'ha-params: ha-mode="nodes" list must be non-empty'),
    ({"ha-mode": "all", "ha-params": 1}, "ha-params", 'ha-params: ha-mode="all" does not take parameters'),
    ({"ha-params": 2}, "ha-mode", "ha-mode must be specified to specify ha-params, "
                                  "ha-sync-mode or ha-promote-on-shutdown"),
    ({"ha-sync-mode": "manual"}, "ha-mode", "ha-mode must be specified to specify ha-params, "
                                            "ha-sync-mode or ha-promote-on-shutdown"),
    ({"ha-mode": "all", "ha-sync-mode": "x"}, "ha-sync-mode",
     'ha-sync-mode must be "manual" or "automatic", got <<"x">>'),
    ({"ha-mode": "all", "ha-sync-batch-size": 0}, "ha-sync-batch-size",
     "ha-sync-batch-size takes an integer greater than 0, 0 given"),
    ({"ha-mode": "all", "ha-promote-on-shutdown": "x"}, "ha-promote-on-shutdown",
     'ha-promote-on-shutdown must be "always" or "when-synced", got <<"x">>'),
    ({"ha-mode": "all", "ha-promote-on-failure": "x"}, "ha-promote-on-failure",
     'ha-promote-on-failure must be "always" or "when-synced", got <<"x">>'),
    ({"audit": "yes"}, "audit", '<<"yes">> is not a valid audit value'),
    ({}, "definition", "no policy provided"),
])
def test_invalid_definitions_are_refused_with_rabbitmqs_text(definition, key, text):
    with pytest.raises(PolicyError) as info:
        validate_definition(definition)
    assert info.value.text == text
    assert info.value.key == key
    assert info.value.reason == f"Validation failed\n\n{text}\n"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("definition", [
    {"message-ttl": 4294967296}, {"expires": 1}, {"max-length": 0}, {"max-length-bytes": 0},
    {"overflow": "reject-publish-dlx"}, {"dead-letter-exchange": ""},
    {"dead-letter-routing-key": "k"}, {"delivery-limit": 0}, {"alternate-exchange": "ae"},
    {"queue-master-locator": "client-local"}, {"queue-mode": "lazy"}, {"audit": True},
    {"ha-mode": "all", "ha-sync-mode": "automatic"}, {"ha-mode": "nodes", "ha-params": ["a"]},
    {"ha-mode": "exactly", "ha-params": 2, "ha-sync-batch-size": 5,
     "ha-promote-on-shutdown": "always", "ha-promote-on-failure": "when-synced"},
])
def test_valid_definitions_pass(definition):
    assert validate_definition(definition) == definition


@pytest.mark.parametrize("definition, text", [
    ({"overflow": "reject-publish"},
     '[{<<"overflow">>,<<"reject-publish">>}] are not recognised policy settings'),
    ({"dead-letter-exchange": "x"},
     '[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings'),
    ({"ha-mode": "all"}, '[{<<"ha-mode">>,<<"all">>}] are not recognised policy settings'),
])
def test_operator_policies_take_only_limits(definition, text):
    for ok in ({"message-ttl": 1}, {"expires": 1}, {"max-length": 1}, {"max-length-bytes": 1},
               {"delivery-limit": 1}):
        validate_definition(ok, operator=True)
    with pytest.raises(PolicyError, match="are not recognised policy settings") as info:
        validate_definition(definition, operator=True)
    assert info.value.text == text


@pytest.mark.parametrize("body, key, reason", [
    ({"pattern": "(", "definition": {"max-length": 1}}, "pattern",
     'pattern should be regular expression but is invalid: {"missing ), unterminated subpattern",1}'),
    ({"pattern": 5, "definition": {"max-length": 1}}, "pattern",
     "pattern should be a binary but was 5"),
    ({"pattern": ".*", "definition": {"max-length": 1}, "priority": "a"}, "priority",
     'priority should be a number, actually was <<"a">>'),
    ({"pattern": ".*", "definition": {"max-length": 1}, "priority": True}, "priority",
     "priority should be a number, actually was true"),
    ({"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "classic_queue"},
     "apply-to", "apply-to 'classic_queue' unrecognised; should be one of: 'queues', "
     "'classic_queues', 'quorum_queues', 'streams', 'exchanges', or 'all'"),
])
def test_invalid_policy_fields(body, key, reason):
    with pytest.raises(PolicyError) as info:
        parse_policy("/", "p", body)
    assert info.value.key == key
    assert info.value.reason == f"Validation failed\n\n{reason}\n"


@pytest.mark.parametrize("missing", ["pattern", "definition"])
def test_missing_fields_are_rabbitmqs_key_missing(missing):
    body = {"pattern": ".*", "definition": {"max-length": 1}}
    del body[missing]
    with pytest.raises(MissingKey) as info:
        parse_policy("/", "p", body)
    assert info.value.reason == f"[{{key_missing,{missing}}}]"


def test_defaults_are_rabbitmqs():
    p = parse_policy("/", "p", {"pattern": "^a", "definition": {"max-length": 1}, "foo": 1})
    assert p.as_dict() == {"vhost": "/", "name": "p", "pattern": "^a", "apply-to": "all",
                           "definition": {"max-length": 1}, "priority": 0}
    assert parse_policy("/", "p", {"pattern": "", "definition": {"max-length": 1},
                                   "priority": -3}).priority == -3
