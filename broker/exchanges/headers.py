"""headers: match on message headers with x-match all/any (and the -with-x variants)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from .base import Binding, Exchange

if TYPE_CHECKING:
    from .base import Destination

MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def match_mode(arguments: dict[str, Any]) -> str | None:
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    return mode if mode in MATCH_MODES else None


def _norm(value: object) -> object:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, (bytes, bytearray)) else value


def headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = match_mode(arguments) or "all"
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    checked = 0
    for key, expected in arguments.items():
        if key == "x-match" or (not with_x and key.startswith("x-")):
            continue
        checked += 1
        if key not in headers:
            ok = False
        elif expected is None:  # void in the binding: presence is enough
            ok = True
        else:
            ok = _norm(headers[key]) == _norm(expected)
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


class HeadersExchange(Exchange):
    type_name = "headers"

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        if match_mode(arguments or {}) is None:
            mode = arguments.get("x-match")
            raise errors.precondition_failed(
                'Invalid x-match field value <<"%s">>; expected all, any, all-with-x, or any-with-x',
                _norm(mode))

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        headers = headers or {}
        return [b.destination for b in self.bindings.values() if headers_match(b.arguments, headers)]
