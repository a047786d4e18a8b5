"""x-delayed-message delegates bindings and routing to an inner exchange of its type."""
import pytest

from broker.exchanges.base import Binding
from broker.exchanges.delayed import DelayedMessageExchange


class Dest:
    kind = "queue"

    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("xtype,key,headers,hit", [
    ("direct", "k", None, True), ("direct", "other", None, False),
    ("fanout", "anything", None, True),
    ("topic", "a.b.c", None, True), ("topic", "b.a", None, False),
    ("headers", "", {"h": b"v"}, True), ("headers", "", {"h": b"w"}, False),
])
def test_routes_like_its_delayed_type(xtype, key, headers, hit):
    x = DelayedMessageExchange("dx", durable=True, arguments={"x-delayed-type": xtype})
    q = Dest("q")
    rk = {"direct": "k", "fanout": "", "topic": "a.#", "headers": ""}[xtype]
    args = {"x-match": "all", "h": b"v"} if xtype == "headers" else {}
    b = Binding("dx", q, rk, args)
    assert x.add_binding(b) and not x.add_binding(Binding("dx", q, rk, args))
    assert x.has_bindings and x.bindings[b.key] is b and x.inner.bindings is x.bindings
    assert (x.route(key, headers) == [q]) is hit
    assert x.remove_binding(b.key) is b and x.remove_binding(b.key) is None
    assert not x.has_bindings and x.route(key, headers) == []
