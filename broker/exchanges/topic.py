"""topic: dot-separated words, '*' one word, '#' zero or more.

Bindings live in a trie keyed by word, so a lookup visits only the branches the
routing key can match: its cost depends on the key and the wildcards on its
path, not on how many bindings there are (100,000 bindings route as fast as 10).
"""
from __future__ import annotations

from typing import Any

from .base import Binding, Exchange


def _words(key: str) -> list:
    # RabbitMQ: the empty key has no words (so '*' does not match it, '#' does)
    return key.split(".") if key else []


class _Node:
    __slots__ = ("bindings", "children")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.bindings: dict[tuple, object] = {}


class TopicExchange(Exchange):
    type_name = "topic"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._root = _Node()

    def _index_add(self, binding: Binding) -> None:
        node = self._root
        for word in _words(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        node.bindings[binding.key] = binding.destination

    def _index_remove(self, binding: Binding) -> None:
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

    def route(self, routing_key: str, headers: dict | None,
              properties: dict | None = None) -> list:
        out: dict = {}
        self._match(self._root, _words(routing_key), 0, out)
        return list(out.values())

    def _match(self, node: _Node, words: list, i: int, out: dict) -> None:
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
