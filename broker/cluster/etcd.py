"""Coordination through etcd v3: the ``Coordinator`` contract and its HTTP implementation.

No maintained Python etcd v3 client exists (python-etcd3 breaks with current protobuf),
so ``EtcdGateway`` speaks etcd's own JSON gRPC gateway (``/v3/kv/*``, ``/v3/lease/*``,
``/v3/watch``) over HTTP with httpx, which runs on trio. Keys and values are bytes on
the wire (base64 in the JSON); this module hands out ``str`` keys and ``bytes`` values.
Anything else that fulfils ``Coordinator`` (a gRPC client, ZooKeeper) can replace it.
"""
from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import trio

log = logging.getLogger("broker.cluster.etcd")
# httpx logs every request at INFO: a lease renewal every TTL/3 would flood the broker's log
logging.getLogger("httpx").setLevel(logging.WARNING)


class CoordinationUnavailable(RuntimeError):
    """No endpoint of the coordination service answered (down, unreachable, too slow).

    The operation may or may not have been applied: callers treat a write as in doubt."""


class CoordinationError(RuntimeError):
    """The coordination service answered with an error (bad request, unknown lease...)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int  # revision that created this incarnation of the key (an epoch)
    mod_revision: int
    lease: int  # 0: not attached to a lease

    def json(self) -> Any:
        return json.loads(self.value)


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" | "delete"
    kv: KeyValue  # for "delete": value is b"" and only key / mod_revision are meaningful


class Coordinator(Protocol):
    """A strongly consistent key-value service with leases and watches (etcd v3).

    Every method may raise ``CoordinationUnavailable`` when no endpoint answers within
    the client's timeout (the write is then in doubt: it may have been applied), and
    ``CoordinationError`` when the service refuses the request. Nothing is retried
    behind the caller's back except the move to the next endpoint. The coordinator
    owns its HTTP connections; ``aclose`` releases them.
    """

    async def get(self, key: str) -> KeyValue | None:
        """The current value of ``key``, or None."""
        ...

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the store revision of that read
        (a watch from ``revision + 1`` sees every later change)."""
        ...

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Set ``key`` (attached to ``lease`` when non-zero); returns the new revision.
        Raises CoordinationError for an expired or unknown lease."""
        ...

    async def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it with ``prefix``); returns how many."""
        ...

    async def create(self, key: str, value: bytes, lease: int = 0) -> tuple[bool, KeyValue | None]:
        """Set ``key`` only if it does not exist, atomically. Returns ``(True, new kv)``
        if this call created it, else ``(False, the kv that exists)`` (which may be None
        if it vanished in between)."""
        ...

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        """Set ``key`` only if its ``mod_revision`` is still ``mod_revision`` (compare
        and swap; 0 means "does not exist"). True if it was written."""
        ...

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        """Delete ``key`` only if its ``mod_revision`` is still ``mod_revision``."""
        ...

    async def fenced_put(self, key: str, value: bytes, fence_key: str, epoch: int) -> bool:
        """Set ``key`` only while ``fence_key`` is the incarnation created at revision
        ``epoch`` (a queue master's record): a deposed master's write is refused.
        True if it was written."""
        ...

    async def write_batch(self, puts: Sequence[tuple[str, bytes]], deletes: Sequence[str]) -> int:
        """Apply many puts and deletes in one transaction (all or nothing); returns the
        revision. At most ``MAX_TXN_OPS`` operations per call."""
        ...

    async def grant(self, ttl: float) -> tuple[int, float]:
        """A new lease of ``ttl`` seconds (rounded up to whole seconds, at least 1):
        ``(lease id, granted ttl)``."""
        ...

    def describe(self) -> str:
        """The endpoints, for the log."""
        ...

    def keepalive_blocking(self, lease: int) -> float:
        """``keepalive`` from a thread of its own (``node._Renewer``): a busy event loop
        must not delay the renewal of a short lease."""
        ...

    async def keepalive(self, lease: int) -> float:
        """Renew ``lease``; returns its remaining TTL in seconds, 0 if it has expired
        (its keys are gone: the holder lost everything attached to it)."""
        ...

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys (no error if it is already gone)."""
        ...

    async def watch(self, prefix: str, start_revision: int,
                    on_events: Callable[[list[WatchEvent], int], Awaitable[None]]) -> None:
        """Call ``on_events(events, revision)`` for every change under ``prefix`` from
        ``start_revision`` on, in order, until cancelled. Raises CoordinationUnavailable
        when the stream breaks (the caller re-reads and watches again) and
        CoordinationError when the revision was compacted away."""
        ...

    async def aclose(self) -> None:
        """Release connections; the coordinator is unusable afterwards."""
        ...


#: etcd's default --max-txn-ops
MAX_TXN_OPS = 128


def _b64(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _prefix_end(prefix: str) -> str:
    """The first key after every key starting with ``prefix`` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return _b64(bytes(raw))
        raw.pop()
    return _b64(b"\0")


def _kv(d: dict) -> KeyValue:
    return KeyValue(key=_unb64(d.get("key")).decode(), value=_unb64(d.get("value")),
                    create_revision=int(d.get("create_revision", 0)),
                    mod_revision=int(d.get("mod_revision", 0)), lease=int(d.get("lease", 0)))


class EtcdGateway:
    """``Coordinator`` over etcd's JSON gateway. ``endpoints``: ``["host:port", ...]``;
    a request that gets no answer from one endpoint (connect error, ``timeout``) goes
    to the next; when all fail it raises CoordinationUnavailable naming them."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0):
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._current = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout))
        self._blocking_client: httpx.Client | None = None

    def describe(self) -> str:
        return ",".join(self.endpoints)

    async def _call(self, path: str, body: dict) -> dict:
        last: Exception | None = None
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._current + i) % n
            url = f"http://{self.endpoints[idx]}{path}"
            try:
                resp = await self._client.post(url, json=body)
            except (httpx.TransportError, OSError) as exc:
                last = exc
                continue
            if resp.status_code >= 500 and "error" not in resp.text[:200]:
                last = RuntimeError(f"HTTP {resp.status_code}")
                continue
            self._current = idx
            data = resp.json()
            if resp.status_code != 200 or ("error" in data and "header" not in data):
                message = data.get("message") or data.get("error") or resp.text
                if "no leader" in str(message) or resp.status_code == 503:
                    last = RuntimeError(str(message))
                    continue
                raise CoordinationError(f"etcd {path}: {message}")
            return data
        raise CoordinationUnavailable(f"etcd unreachable at {self.describe()} "
                                      f"({type(last).__name__}: {last})" if last else
                                      f"etcd unreachable at {self.describe()}")

    async def get(self, key: str) -> KeyValue | None:
        data = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = data.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        data = await self._call("/v3/kv/range", {"key": _b64(prefix),
                                                 "range_end": _prefix_end(prefix)})
        return [_kv(d) for d in data.get("kvs") or []], int(data["header"]["revision"])

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        body: dict = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        data = await self._call("/v3/kv/put", body)
        return int(data["header"]["revision"])

    async def delete(self, key: str, prefix: bool = False) -> int:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _prefix_end(key)
        data = await self._call("/v3/kv/deleterange", body)
        return int(data.get("deleted", 0))

    def _put_op(self, key: str, value: bytes, lease: int = 0) -> dict:
        put: dict = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        return {"request_put": put}

    async def create(self, key: str, value: bytes, lease: int = 0) -> tuple[bool, KeyValue | None]:
        data = await self._call("/v3/kv/txn", {
            "compare": [{"target": "CREATE", "key": _b64(key), "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [self._put_op(key, value, lease)],
            "failure": [{"request_range": {"key": _b64(key)}}]})
        if data.get("succeeded"):
            rev = int(data["header"]["revision"])
            return True, KeyValue(key, value, rev, rev, lease)
        kvs = (data.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        return False, _kv(kvs[0]) if kvs else None

    async def replace(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        data = await self._call("/v3/kv/txn", {
            "compare": [{"target": "MOD", "key": _b64(key), "result": "EQUAL",
                         "mod_revision": str(mod_revision)}],
            "success": [self._put_op(key, value, lease)]})
        return bool(data.get("succeeded"))

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        data = await self._call("/v3/kv/txn", {
            "compare": [{"target": "MOD", "key": _b64(key), "result": "EQUAL",
                         "mod_revision": str(mod_revision)}],
            "success": [{"request_delete_range": {"key": _b64(key)}}]})
        return bool(data.get("succeeded"))

    async def fenced_put(self, key: str, value: bytes, fence_key: str, epoch: int) -> bool:
        data = await self._call("/v3/kv/txn", {
            "compare": [{"target": "CREATE", "key": _b64(fence_key), "result": "EQUAL",
                         "create_revision": str(epoch)}],
            "success": [self._put_op(key, value)]})
        return bool(data.get("succeeded"))

    async def write_batch(self, puts: Sequence[tuple[str, bytes]], deletes: Sequence[str]) -> int:
        if len(puts) + len(deletes) > MAX_TXN_OPS:
            raise ValueError(f"more than {MAX_TXN_OPS} operations in one etcd transaction")
        ops = [self._put_op(k, v) for k, v in puts]
        ops += [{"request_delete_range": {"key": _b64(k)}} for k in deletes]
        data = await self._call("/v3/kv/txn", {"success": ops})
        return int(data["header"]["revision"])

    async def grant(self, ttl: float) -> tuple[int, float]:
        data = await self._call("/v3/lease/grant", {"TTL": str(max(1, int(-(-ttl // 1))))})
        return int(data["ID"]), float(data["TTL"])

    async def keepalive(self, lease: int) -> float:
        # the gateway's keepalive is a stream; one request gets one answer line
        data = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result = data.get("result", data)
        return float(result.get("TTL", 0) or 0)

    def keepalive_blocking(self, lease: int) -> float:
        """``keepalive`` from a thread (its own blocking client), so that a renewal never
        waits for the event loop's turn between its request and etcd's answer."""
        last: Exception | None = None
        n = len(self.endpoints)
        if self._blocking_client is None:  # the renewal thread's alone
            self._blocking_client = httpx.Client(timeout=httpx.Timeout(self.timeout))
        client = self._blocking_client
        if client is not None:
            for i in range(n):
                idx = (self._current + i) % n
                try:
                    resp = client.post(f"http://{self.endpoints[idx]}/v3/lease/keepalive",
                                       json={"ID": str(lease)})
                except (httpx.TransportError, OSError) as exc:
                    last = exc
                    continue
                if resp.status_code != 200:
                    last = RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                    continue
                data = resp.json()
                if "error" in data and "result" not in data and "header" not in data:
                    last = RuntimeError(str(data.get("message") or data.get("error")))
                    continue
                result = data.get("result", data)
                return float(result.get("TTL", 0) or 0)
        raise CoordinationUnavailable(f"etcd unreachable at {self.describe()} "
                                      f"({type(last).__name__}: {last})" if last else
                                      f"etcd unreachable at {self.describe()}")

    async def revoke(self, lease: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except CoordinationError as exc:
            if "not found" not in str(exc):
                raise

    async def watch(self, prefix: str, start_revision: int,
                    on_events: Callable[[list[WatchEvent], int], Awaitable[None]]) -> None:
        body = {"create_request": {"key": _b64(prefix), "range_end": _prefix_end(prefix),
                                   "start_revision": str(start_revision)}}
        url = f"http://{self.endpoints[self._current]}/v3/watch"
        # no read timeout: the stream is silent while nothing changes; progress
        # notifications would need etcd's --experimental flags, so the caller's
        # lease keepalive is what detects a dead etcd
        timeout = httpx.Timeout(self.timeout, read=None)
        try:
            async with self._client.stream("POST", url, json=body, timeout=timeout) as resp:
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    if "error" in msg:
                        raise CoordinationError(f"etcd watch: {msg['error'].get('message')}")
                    result = msg.get("result") or {}
                    if result.get("compact_revision") and int(result["compact_revision"]) > 0:
                        raise CoordinationError("etcd watch: revision compacted")
                    events = [WatchEvent("delete" if e.get("type") == "DELETE" else "put",
                                         _kv(e.get("kv") or {}))
                              for e in result.get("events") or []]
                    if events:
                        await on_events(events, int(result["header"]["revision"]))
        except (httpx.TransportError, OSError) as exc:
            raise CoordinationUnavailable(f"etcd watch stream broke: {exc}") from exc
        raise CoordinationUnavailable("etcd watch stream ended")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._client.aclose()
        if self._blocking_client is not None:
            self._blocking_client.close()
