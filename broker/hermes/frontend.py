"""Hermes' frontend: ``POST /topics/{topic}`` on a lean HTTP/1.1 listener of its own
(``--hermes-port``), as Hermes runs its frontend apart from its management.

Why a second listener: the management app (hypercorn + starlette) costs ~0.7 ms of CPU per
request before any broker work, which caps publishing well below 1,000 requests/s at a
5 ms p99 on one core. This server parses only what publishing needs. The same routes stay
available on the management port.

Per connection: one task (in the listener's nursery, ended with the connection), one request
at a time, keep-alive. Bounded: a head above ``MAX_HEAD`` gets 431, a body above the topic's
``maxMessageSize`` 413 (the connection is then closed, the rest of the body unread), bodies
past the broker's ``BodyBudget`` (shared with the management port) 503, a body without
Content-Length 411, a request not complete within ``REQUEST_TIMEOUT`` 408 and an idle
connection is closed after ``IDLE_TIMEOUT``.

Authentication: HTTP basic credentials of any user (``broker.access``; 401 otherwise, after
the failed-login delay) with write permission on the topic's exchange (403). The result is
kept per connection for the same Authorization header, so keep-alive publishers pay once.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
from urllib.parse import unquote

import trio

from ..management.auth import login
from ..management.http import BodyBudget
from .http import check
from .model import HermesError

log = logging.getLogger("broker.hermes.frontend")

MAX_HEAD = 16 * 1024
REQUEST_TIMEOUT = 30.0
IDLE_TIMEOUT = 60.0
_REASONS = {200: "OK", 201: "Created", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Payload Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}


class _Close(Exception):
    """The connection ends (EOF, timeout, or after an error answer)."""


def _response(status: int, headers: dict | None = None, body: bytes = b"",
              close: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", f"Content-Length: {len(body)}"]
    if body:
        lines.append("Content-Type: application/json")
    if close:
        lines.append("Connection: close")
    if headers:
        lines.extend(f"{k}: {v}" for k, v in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body


def _error(exc: HermesError, close: bool = False) -> bytes:
    return _response(exc.status, exc.headers, json.dumps(exc.body()).encode(), close)


class Frontend:
    """The listener; ``port`` is the bound port once ``run`` has started (``started``)."""

    def __init__(self, hermes, host: str, port: int, bodies: BodyBudget | None = None):
        self.hermes = hermes
        self.bodies = bodies  # shared with the management port: bodies held at once
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.started = trio.Event()

    async def run(self) -> None:
        host = None if self.host in ("", "*", "0.0.0.0") else self.host
        listeners = await trio.open_tcp_listeners(self.requested_port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("Hermes frontend listening on %s:%s", self.host, self.port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            self.started.set()

    async def _handle(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        try:
            peer = stream.socket.getpeername()[0]
        except OSError:
            peer = None
        self_auth: dict = {}  # this connection's Authorization header -> user
        try:
            while True:
                with trio.move_on_after(IDLE_TIMEOUT) as idle:
                    while not buf:
                        await self._fill(stream, buf)
                if idle.cancelled_caught:
                    return
                with trio.move_on_after(REQUEST_TIMEOUT) as slow:
                    answer, close = await self._request(stream, buf, peer, self_auth)
                if slow.cancelled_caught:
                    answer, close = _error(HermesError(408, "Request not received in time",
                                                       "REQUEST_TIMEOUT"), True), True
                await stream.send_all(answer)
                if close:
                    return
        except (_Close, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except Exception:  # one bad connection must not take the listener down
            log.exception("Hermes frontend connection failed")
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    @staticmethod
    async def _fill(stream: trio.SocketStream, buf: bytearray) -> None:
        data = await stream.receive_some(65536)
        if not data:
            raise _Close()
        buf += data

    async def _user(self, header: str | None, peer: str | None, cache: dict):
        """The user for this Authorization header, or None (then after the login delay)."""
        if header is None:
            return None
        if header in cache:
            return cache[header]
        scheme, _, value = header.partition(" ")
        user = None
        if scheme.lower() == "basic":
            try:
                name, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                sep = ""
            if sep:
                user = login(self.hermes.services.access, name, password, peer)
        if user is None:
            await trio.sleep(self.hermes.services.access.failure_delay)
            return None
        cache.clear()
        cache[header] = user
        return user

    async def _request(self, stream: trio.SocketStream, buf: bytearray, peer: str | None,
                       auth: dict) -> tuple[bytes, bool]:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                return _error(HermesError(431, "Request head too large", "VALIDATION_ERROR"),
                              True), True
            await self._fill(stream, buf)
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end + 4]
        request_line, _, rest = head.partition("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _error(HermesError(400, "Malformed request line"), True), True
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in rest.split("\r\n"):
            name, sep, value = line.partition(":")
            if not sep:
                return _error(HermesError(400, "Malformed header line"), True), True
            headers[name.strip().lower()] = value.strip()
        conn_header = headers.get("connection", "").lower()
        close = conn_header == "close" or (version == "HTTP/1.0" and conn_header != "keep-alive")
        path = target.split("?", 1)[0]
        if not path.startswith("/topics/") or "/" in path[8:] or len(path) == 8:
            return _error(HermesError(404, f"No such resource {path[:100]}", "NOT_FOUND"),
                          True), True
        if method != "POST":
            return _error(HermesError(405, "Only POST publishes here", "METHOD_NOT_ALLOWED"),
                          True), True
        if "chunked" in headers.get("transfer-encoding", "").lower() or \
                "content-length" not in headers:
            return _error(HermesError(411, "Content-Length is required", "VALIDATION_ERROR"),
                          True), True
        try:
            length = int(headers["content-length"])
        except ValueError:
            return _error(HermesError(400, "Malformed Content-Length"), True), True
        name = unquote(path[8:])
        hermes = self.hermes
        user = await self._user(headers.get("authorization"), peer, auth)
        if user is None:
            return _error(HermesError(401, "Login failed", "UNAUTHORIZED",
                                      {"WWW-Authenticate": 'Basic realm="TrioMQ"'}), True), True
        try:
            check(hermes.services.access, user, "exchange", name, "write")
            topic = hermes.get_topic(name)
            if length > topic.maxMessageSize or length < 0:
                raise HermesError(413, f"Message size {length} exceeds the topic's maximum "
                                       f"{topic.maxMessageSize} bytes", "MESSAGE_TOO_LARGE")
        except HermesError as exc:
            return _error(exc, True), True  # the body is not read: the connection cannot go on
        if headers.get("expect", "").lower() == "100-continue":
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        bodies = self.bodies
        received = 0
        body = b""
        try:
            while True:
                before, received = received, min(len(buf), length)
                if bodies is not None and not bodies.grew(before, received):
                    return _error(HermesError(503, bodies.refusal(), "SERVICE_UNAVAILABLE",
                                              {"Retry-After": "1"}), True), True
                if received == length:
                    break
                await self._fill(stream, buf)
            body = bytes(buf[:length])
            del buf[:length]
            extra = ({"Partition-Key": headers["partition-key"]} if "partition-key" in headers
                     else None)
            try:
                result = await hermes.publish(name, body, headers.get("content-type"), extra,
                                              user.name, peer)
            except HermesError as exc:
                return _error(exc, close), close
            except Exception:
                log.exception("publish to %s failed", name)
                return _error(HermesError(500, "Internal error", "INTERNAL_ERROR"), True), True
        finally:
            body = b""  # released before done() trims the heap after a big body
            if bodies is not None:
                bodies.done(received)
        return _response(result.status, {"Hermes-Message-Id": result.message_id}, close=close), close
