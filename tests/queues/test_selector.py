"""x-filter selectors: the JMS/SQL-92 subset, three-valued logic, and errors with positions."""
from __future__ import annotations

import pytest

from broker.queues.selector import SelectorError, compile_selector

from ..support import make_message

MSG = make_message(b"x", exchange="orders", routing_key="eu.paid",
                   headers={"color": b"red", "weight": 5, "region": "eu-west", "vip": True,
                            "ratio": 0.5},
                   priority=3, message_id="m-1", type="order")


@pytest.mark.parametrize(("text", "selected"), [
    ("color = 'red'", True),
    ("color <> 'red'", False),
    ("COLOR = 'red'", False),  # identifiers are case-sensitive, keywords are not
    ("color = 'red' and weight > 4", True),
    ("weight >= 5 AND weight <= 5", True),
    ("weight < 5 OR ratio < 1", True),
    ("weight BETWEEN 1 AND 5", True),
    ("weight NOT BETWEEN 1 AND 4", True),
    ("weight * 2 + 1 = 11", True),
    ("-weight < 0 AND weight / 2 = 2.5", True),
    ("color IN ('blue', 'red')", True),
    ("color NOT IN ('red')", False),
    ("region LIKE 'eu-%'", True),
    ("region LIKE 'eu-____'", True),
    ("region LIKE 'eu_w%'", True),
    ("region NOT LIKE 'us%'", True),
    ("region LIKE 'eu!-%' ESCAPE '!'", True),
    ("missing IS NULL", True),
    ("color IS NOT NULL", True),
    ("vip = TRUE", True),
    ("vip", True),
    ("JMSPriority > 2 AND priority = 3", True),
    ("JMSMessageID = 'm-1' AND JMSType = 'order'", True),
    ("routing_key LIKE 'eu.%' AND exchange = 'orders'", True),
    # NULL and type mismatches are unknown, and unknown is not selected
    ("missing = 1", False),
    ("NOT missing = 1", False),
    ("missing = 1 OR color = 'red'", True),
    ("missing = 1 AND color = 'red'", False),
    ("NOT (missing = 1 AND color = 'blue')", True),  # unknown AND false = false
    ("weight = '5'", False),
    ("color > 1", False),
    ("weight / 0 = 1", False),
    ("missing BETWEEN 1 AND 2", False),
    ("missing IN ('a')", False),
    ("missing NOT IN ('a')", False),
    ("weight LIKE '5'", False),
    ("'it''s' = 'it''s'", True),
])
def test_selection(text, selected):
    assert compile_selector(text)(MSG) is selected


@pytest.mark.parametrize(("text", "position"), [
    ("color = ", 9),
    ("color == 'red'", 8),
    ("x IN ()", 7),
    ("'abc", 1),
    ("a = 1 b", 7),
    ("", 1),
    ("   ", 1),
    ("x LIKE 'a' ESCAPE 'ab'", 19),
    ("(a = 1", 7),
])
def test_errors_name_the_position(text, position):
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    assert info.value.position == position
    assert str(info.value).startswith(f"at position {position}: ")


def test_overlong_expression_is_refused():
    with pytest.raises(SelectorError):
        compile_selector("a = 1 AND " * 500 + "b = 2")
