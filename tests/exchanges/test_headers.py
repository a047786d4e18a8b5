"""headers exchange: x-match all / any and their -with-x variants, as RabbitMQ 3.10."""
from __future__ import annotations

import pytest

from broker.exchanges import HeadersExchange
from broker.exchanges.headers import headers_match, match_mode

from ._dest import Dest, bind

ALL = {"x-match": "all", "a": 1, "b": "two"}
ANY = {"x-match": "any", "a": 1, "b": "two"}


@pytest.mark.parametrize(("arguments", "headers", "matches"), [
    (ALL, {"a": 1, "b": "two"}, True),
    (ALL, {"a": 1, "b": "two", "c": 3}, True),
    (ALL, {"a": 1}, False),
    (ALL, {"a": 2, "b": "two"}, False),
    (ALL, {}, False),
    (ANY, {"a": 1}, True),
    (ANY, {"b": "two", "z": 0}, True),
    (ANY, {"a": 2, "b": "three"}, False),
    (ANY, {}, False),
    ({"a": 1}, {"a": 1}, True),  # no x-match: all
    ({"a": 1, "b": 2}, {"a": 1}, False),
    ({"x-match": "all"}, {}, True),  # nothing to check: all matches
    ({"x-match": "any"}, {"a": 1}, False),  # nothing to check: any fails
    # x- keys are ignored unless the mode says -with-x
    ({"x-match": "all", "x-tenant": "t1"}, {}, True),
    ({"x-match": "all-with-x", "x-tenant": "t1"}, {}, False),
    ({"x-match": "all-with-x", "x-tenant": "t1"}, {"x-tenant": "t1"}, True),
    ({"x-match": "any", "x-tenant": "t1", "a": 1}, {"x-tenant": "t1"}, False),
    ({"x-match": "any-with-x", "x-tenant": "t1", "a": 1}, {"x-tenant": "t1"}, True),
    ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
    # a void value in the binding only asks for presence
    ({"x-match": "all", "a": None}, {"a": "anything"}, True),
    ({"x-match": "all", "a": None}, {"b": 1}, False),
    # longstr on the wire (bytes) equals the same text
    ({"x-match": "all", "b": b"two"}, {"b": "two"}, True),
    ({"x-match": "all", "b": "two"}, {"b": b"two"}, True),
    ({"x-match": b"any", "a": 1}, {"a": 1}, True),
    # values compare by type too: 1 is not "1"
    ({"a": 1}, {"a": "1"}, False),
])
def test_headers_match(arguments, headers, matches):
    assert headers_match(arguments, headers) is matches
    x = HeadersExchange("h")
    q = Dest("q")
    bind(x, q, "ignored-key", arguments)
    assert (x.route("whatever", headers) == [q]) is matches


def test_invalid_mode_is_reported():
    assert match_mode({"x-match": "some"}) is None
    assert match_mode({"x-match": b"any-with-x"}) == "any-with-x"
    assert match_mode({}) == "all"


def test_no_headers_property_matches_only_empty_all_bindings():
    x = HeadersExchange("h")
    empty, needs_a = Dest("empty"), Dest("needs-a")
    bind(x, empty, "", {})
    bind(x, needs_a, "", {"a": 1})
    assert x.route("", None) == [empty]


def test_routing_key_is_ignored_and_unbind_stops_routing():
    x = HeadersExchange("h")
    q = Dest("q")
    b = bind(x, q, "k1", {"x-match": "any", "a": 1})
    assert x.route("other", {"a": 1}) == [q]
    x.remove_binding(b.key)
    assert x.route("other", {"a": 1}) == []
