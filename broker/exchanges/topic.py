"""topic: dot-separated words, '*' one word, '#' zero or more.

Bindings live in a trie keyed by word, so a lookup visits only the branches the
routing key can match: its cost depends on the key and the wildcards on its
path, not on how many bindings there are (100,000 bindings route as fast as 10).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Binding, Exchange

if TYPE_CHECKING:
    from .base import BindingKey, Destination


def _words(key: str) -> list[str]:
    # RabbitMQ: the empty key has no words (so '*' does not match it, '#' does)
    return key.split(".") if key else []


class _Node:
    __slots__ = ("bindings", "children")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.bindings: dict[BindingKey, Destination] = {}


CACHE_KEYS = 4096  # routing keys whose destinations a topic exchange remembers

# A binding argument marking an MQTT subscription (its value: the filter as subscribed), to
# which MQTT's rule applies: a filter starting with a wildcard does not match topic names
# starting with '$' (MQTT-4.7.2-1).
MQTT_SUBSCRIPTION_ARG = "x-mqtt-subscription"


class TopicExchange(Exchange):
    type_name = "topic"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._root = _Node()
        # MQTT subscriptions whose filter starts with a wildcard: they never match a key
        # starting with '$' (MQTT-4.7.2-1); AMQP bindings keep AMQP's meaning
        self._no_dollar: set[BindingKey] = set()
        # routing key -> destinations: publishers repeat keys (a device its topic, a service
        # its event names), and the trie walk costs several microseconds with wildcards on
        # the path. Any binding change empties it; bounded by emptying when full.
        self._cache: dict[str, tuple[Destination, ...]] = {}

    def _index_add(self, binding: Binding) -> None:
        self._cache.clear()
        if MQTT_SUBSCRIPTION_ARG in binding.arguments and binding.routing_key[:1] in ("*", "#"):
            self._no_dollar.add(binding.key)
        node = self._root
        for word in _words(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        node.bindings[binding.key] = binding.destination

    def _index_remove(self, binding: Binding) -> None:
        self._cache.clear()
        self._no_dollar.discard(binding.key)
        path = [self._root]
        words = _words(binding.routing_key)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        path[-1].bindings.pop(binding.key, None)
        # prune empty branches so deleted bindings cost nothing later
        for i in range(len(words) - 1, -1, -1):
            node = path[i + 1]
            if node.bindings or node.children:
                break
            del path[i].children[words[i]]

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        cache = self._cache
        found = cache.get(routing_key)
        if found is None:
            out: dict[BindingKey, Destination] = {}
            self._match(self._root, _words(routing_key), 0, out)
            if self._no_dollar and routing_key[:1] == "$":
                for key in self._no_dollar.intersection(out):
                    del out[key]
            if len(cache) >= CACHE_KEYS:
                cache.clear()
            found = cache[routing_key] = tuple(out.values())
        return list(found)

    def _match(self, node: _Node, words: list[str], i: int,
               out: dict[BindingKey, Destination]) -> None:
        children = node.children
        hash_node = children.get("#")
        if hash_node is not None:
            # '#' swallows zero or more words
            for j in range(i, len(words) + 1):
                self._match(hash_node, words, j, out)
        if i == len(words):
            if node.bindings:
                out.update(node.bindings)
            return
        word = words[i]
        child = children.get(word)
        if child is not None:
            self._match(child, words, i + 1, out)
        star = children.get("*")
        if star is not None:
            self._match(star, words, i + 1, out)
