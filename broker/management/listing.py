"""RabbitMQ's list parameters: ``page``, ``page_size``, ``name``, ``use_regex``, ``sort``,
``sort_reverse`` and ``columns``, with RabbitMQ's answers and error texts.

Without ``page`` a list is a plain JSON array (``name`` is ignored, as in RabbitMQ); with it,
``{"filtered_count", "item_count", "items", "page", "page_count", "page_size",
"total_count"}``. When the sort key is the name (the default) only the requested page is
rendered, so page 1 of 10,000 queues costs a sort of names, not 10,000 renderings.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request

from .http import ApiError

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def _path_get(item: dict, path: list[str]) -> Any:
    value: Any = item
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _sort_value(value: Any) -> tuple:
    # None first, then numbers, then strings (RabbitMQ sorts mixed terms by Erlang's order)
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value.lower())
    return (3, str(value))


def select_columns(item: dict, columns: list[list[str]]) -> dict:
    out: dict = {}
    for path in columns:
        value: Any = item
        found = True
        for part in path:
            if not isinstance(value, dict) or part not in value:
                found = False
                break
            value = value[part]
        if not found:
            continue
        target = out
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    return out


class ListParams:
    def __init__(self, request: Request):
        q = request.query_params
        self.page_raw = q.get("page")
        self.size_raw = q.get("page_size")
        self.name = q.get("name") or ""
        self.use_regex = q.get("use_regex", "false").lower() == "true"
        sort = q.get("sort") or ""
        self.sort = [p for p in sort.split(".") if p] if sort else []
        self.reverse = q.get("sort_reverse", "false").lower() == "true"
        cols = q.get("columns") or ""
        self.columns = [[p for p in c.split(".") if p] for c in cols.split(",") if c.strip()]
        self.page: int | None = None
        self.page_size = DEFAULT_PAGE_SIZE
        if self.page_raw is not None:
            try:
                self.page = int(self.page_raw)
                if self.size_raw is not None:
                    self.page_size = int(self.size_raw)
            except ValueError:
                raise ApiError(400, "Pagination parameters are invalid") from None
            if self.page < 1 or not 1 <= self.page_size <= MAX_PAGE_SIZE:
                size = self.size_raw if self.size_raw is not None else "undefined"
                raise ApiError(400, f"Invalid pagination parameters: page number {self.page}, "
                                    f"page size {size}", "invalid_pagination_parameters")
        self.matcher: Callable[[str], bool] | None = None
        if self.page is not None and self.name:
            if self.use_regex:
                try:
                    rx = re.compile(self.name, re.IGNORECASE)
                except re.error:
                    raise ApiError(400, "Pagination parameters are invalid") from None
                self.matcher = lambda n: rx.search(n) is not None
            else:
                needle = self.name.lower()
                self.matcher = lambda n: needle in n.lower()


def paginate(request: Request, objects: Iterable, render: Callable[[Any], dict],
             name_of: Callable[[Any], str], group_of: Callable[[Any], str] | None = None):
    """The JSON answer for a list of ``objects`` (rendered with ``render``), applying the
    request's parameters. ``name_of``/``group_of`` give the default order (vhost, name)
    without rendering."""
    p = ListParams(request)
    objs = list(objects)
    total = len(objs)
    if p.matcher is not None:
        objs = [o for o in objs if p.matcher(name_of(o))]
    cheap_sort = not p.sort or p.sort == ["name"]
    if cheap_sort:
        if group_of is not None and not p.sort:
            objs.sort(key=lambda o: (group_of(o), name_of(o)), reverse=p.reverse)
        else:
            objs.sort(key=lambda o: name_of(o), reverse=p.reverse)
        if p.page is not None:
            filtered = len(objs)
            start = (p.page - 1) * p.page_size
            _check_range(p, filtered)
            items = [render(o) for o in objs[start:start + p.page_size]]
            return _page(p, items, filtered, total)
        items = [render(o) for o in objs]
    else:
        items = [render(o) for o in objs]
        items.sort(key=lambda i: _sort_value(_path_get(i, p.sort)), reverse=p.reverse)
        if p.page is not None:
            filtered = len(items)
            _check_range(p, filtered)
            start = (p.page - 1) * p.page_size
            items = items[start:start + p.page_size]
            return _page(p, items, filtered, total)
    if p.columns:
        items = [select_columns(i, p.columns) for i in items]
    return items


def _check_range(p: ListParams, filtered: int) -> None:
    assert p.page is not None
    if p.page > 1 and (p.page - 1) * p.page_size >= filtered:
        raise ApiError(400, f"Page out of range, page: {p.page} page size: {p.page_size}, "
                            f"len: {filtered}", "page_out_of_range")


def _page(p: ListParams, items: list, filtered: int, total: int) -> dict:
    if p.columns:
        items = [select_columns(i, p.columns) for i in items]
    return {"filtered_count": filtered, "item_count": len(items), "items": items,
            "page": p.page, "page_count": max(1, -(-filtered // p.page_size)),
            "page_size": p.page_size, "total_count": total}
