"""A minimal HTTP/1.1 client for push delivery: one keep-alive connection per sender task.

Why not httpx's pool: with a hundred senders its connection pool rescans every connection
for every request (measured: 50 concurrent senders reached ~340 requests/s, one sender
~1,000). Here each sender owns one connection, a request is one ``send_all`` of bytes
formatted at once, and the response is parsed just enough to deliver: status, Retry-After,
a body framed by Content-Length, chunked encoding or the connection's end (then closed).

Plain ``http://`` endpoints use a non-blocking stdlib socket driven by trio's
``wait_readable``/``wait_writable`` (``_RawSocket``): a request costs one ``send`` and one
``recv`` system call and no stream layers, which is most of push delivery's CPU per message.
``https://`` goes through ``trio.SSLStream``.

Contract of ``Connection.post(body, headers, within)``: ``headers`` is a dict or header
lines already formatted (``"Name: value\r\n"``...); returns ``(status, headers)``
(header names lower-case; the body is read and dropped), or raises ``PushError`` (connect,
TLS, reset, malformed response) or ``trio.TooSlowError`` (no complete response within
``within`` seconds); after either the connection is closed and the next ``post`` opens a
new one. Owns its socket; ``aclose()`` releases it.
"""
from __future__ import annotations

import base64
import errno
import math
import socket
import ssl
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

MAX_HEAD = 64 * 1024  # bytes of a response's status line and headers
MAX_BODY = 1 << 20  # bytes of a response body we read (and drop)


class PushError(Exception):
    """The request failed below HTTP (connect, TLS, reset, malformed response)."""


class _Stale(PushError):
    """The endpoint closed the connection before any byte of the response."""


class _RawSocket:
    """A connected non-blocking TCP socket with the two stream methods the client uses."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    async def connect(cls, host: str, port: int) -> _RawSocket:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"cannot resolve {host}")
        last: OSError | None = None
        for family, kind, proto, _name, addr in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                code = sock.connect_ex(addr)
                if code == errno.EINPROGRESS:
                    await trio.lowlevel.wait_writable(sock)
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, errno.errorcode.get(code, str(code)))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return cls(sock)
            except OSError as exc:
                last = exc
                trio.lowlevel.notify_closing(sock)
                sock.close()
            except BaseException:
                trio.lowlevel.notify_closing(sock)
                sock.close()
                raise
        assert last is not None
        raise last

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        sock = self.sock
        while view:
            try:
                view = view[sock.send(view):]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
        # a request that went out in one send still checkpoints here (or in receive_some)

    async def receive_some(self, size: int) -> bytes:
        sock = self.sock
        while True:
            # the response is never there yet right after a send: wait first (a checkpoint)
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(size)
            except BlockingIOError:
                continue

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


class Endpoint:
    """A parsed endpoint URL: host, port, TLS, the request target, basic credentials."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.auth = None
        if parts.username is not None:
            raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.auth = "Basic " + base64.b64encode(raw).decode()


class Watchdog:
    """Request deadlines for many connections without a cancel scope per request (entering
    one was ~13 % of push delivery's CPU per message).

    ``Connection.post`` on a plain-TCP connection given a watchdog records its deadline;
    ``run`` (a task of whoever owns the connections) wakes every ``tick`` seconds while
    requests are in flight and closes the socket of each overdue one, whose ``post`` then
    raises ``trio.TooSlowError``: a timeout fires at most ``tick`` late. Idle, it sleeps."""

    def __init__(self, tick: float):
        self.tick = tick
        self.active: set[Connection] = set()
        self._wake = trio.Event()

    def watch(self, conn: Connection) -> None:
        self.active.add(conn)
        self._wake.set()

    def unwatch(self, conn: Connection) -> None:
        self.active.discard(conn)

    async def run(self) -> None:
        while True:
            if not self.active:
                self._wake = trio.Event()
                await self._wake.wait()
            await trio.sleep(self.tick)
            now = trio.current_time()
            for conn in [c for c in self.active if c.deadline <= now]:
                conn.expire()


class Connection:
    def __init__(self, endpoint: Endpoint, watchdog: Watchdog | None = None):
        self.endpoint = endpoint
        self.watchdog = watchdog if not endpoint.tls else None
        self.deadline = math.inf  # of the request in progress
        self.expired = False  # the watchdog closed the socket: the request timed out
        self._stream: Any = None  # _RawSocket or trio.SSLStream
        self._buf = bytearray()
        ep = endpoint
        self._prefix = f"POST {ep.target} HTTP/1.1\r\nHost: {ep.host_header}\r\n" + (
            f"Authorization: {ep.auth}\r\n" if ep.auth else "")

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        self._buf.clear()
        if isinstance(stream, _RawSocket):
            stream.close()
        elif stream is not None:
            with trio.CancelScope(shield=True):
                try:
                    await trio.aclose_forcefully(stream)
                except Exception:
                    pass

    async def _connect(self) -> Any:
        ep = self.endpoint
        try:
            if not ep.tls:
                return await _RawSocket.connect(ep.host, ep.port)
            stream = await trio.open_tcp_stream(ep.host, ep.port)
            tls = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=ep.host)
            await tls.do_handshake()
            return tls
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise PushError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from None

    def expire(self) -> None:
        """The watchdog's verdict: the request in progress is overdue."""
        self.expired = True
        if self.watchdog is not None:
            self.watchdog.unwatch(self)
        if isinstance(self._stream, _RawSocket):
            trio.lowlevel.notify_closing(self._stream.sock)  # its waits raise at once

    async def post(self, body: bytes, headers: dict | str, within: float) -> tuple[int, dict]:
        self.deadline = trio.current_time() + within
        self.expired = False
        wd = self.watchdog
        if wd is None:
            try:
                with trio.CancelScope(deadline=self.deadline) as scope:
                    return await self._exchange(body, headers)
            except BaseException:
                await self.aclose()
                raise
            await self.aclose()
            assert scope.cancelled_caught
            raise trio.TooSlowError
        wd.watch(self)
        try:
            return await self._exchange(body, headers)
        except BaseException as exc:
            await self.aclose()
            if self.expired and isinstance(exc, Exception):
                raise trio.TooSlowError from None
            raise
        finally:
            wd.unwatch(self)

    async def _exchange(self, body: bytes, headers: dict | str) -> tuple[int, dict]:
        if not isinstance(headers, str):
            headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"{self._prefix}Content-Length: {len(body)}\r\n{headers}\r\n"
                   ).encode("latin-1", "replace") + body
        reused = self._stream is not None
        if self._stream is None:
            await self._open()
        try:
            await self._stream.send_all(request)
            status, rheaders, keep = await self._read_response()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, PushError) as exc:
            await self.aclose()
            if self.expired:
                raise
            if reused and (isinstance(exc, _Stale) or not isinstance(exc, PushError)):
                # the endpoint closed an idle keep-alive connection: retry once on a new one
                await self._open()
                await self._stream.send_all(request)
                status, rheaders, keep = await self._read_response()
            else:
                raise PushError(str(exc) or type(exc).__name__) from None
        if not keep:
            await self.aclose()
        return status, rheaders

    async def _open(self) -> None:
        # a connect has no socket for the watchdog to close yet: a scope of its own (rare)
        with trio.move_on_at(self.deadline) as scope:
            self._stream = await self._connect()
        if scope.cancelled_caught:
            self.expired = True
            raise trio.TooSlowError

    async def _fill(self) -> None:
        assert self._stream is not None
        data = await self._stream.receive_some(65536)
        if not data:
            raise PushError("connection closed by the endpoint")
        self._buf += data

    async def _read_response(self) -> tuple[int, dict, bool]:
        buf = self._buf
        if not buf:
            try:
                await self._fill()
            except PushError:
                raise _Stale("connection closed by the endpoint before a response") from None
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                raise PushError("response head too large")
            await self._fill()
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end + 4]
        status_line, _, rest = head.partition("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise PushError(f"malformed status line {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in rest.split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if 100 <= status < 200:
            return await self._read_response()  # an interim response: the real one follows
        if headers.get("transfer-encoding", "").lower().endswith("chunked"):
            await self._skip_chunked()
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise PushError("malformed Content-Length") from None
            if length > MAX_BODY:
                raise PushError("response body too large")
            while len(buf) < length:
                await self._fill()
            del buf[:length]
        elif status not in (204, 304):
            keep = False  # the body runs until the connection ends: not worth reading
        return status, headers, keep

    async def _skip_chunked(self) -> None:
        buf = self._buf
        total = 0
        while True:
            while b"\r\n" not in buf:
                await self._fill()
            line_end = buf.find(b"\r\n")
            try:
                size = int(bytes(buf[:line_end]).split(b";")[0], 16)
            except ValueError:
                raise PushError("malformed chunk size") from None
            del buf[:line_end + 2]
            total += size
            if total > MAX_BODY:
                raise PushError("response body too large")
            if size == 0:
                while True:  # trailers end with an empty line
                    while b"\r\n" not in buf:
                        await self._fill()
                    line_end = buf.find(b"\r\n")
                    del buf[:line_end + 2]
                    if line_end == 0:
                        return
            while len(buf) < size + 2:
                await self._fill()
            del buf[:size + 2]
