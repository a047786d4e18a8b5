"""The HTTP listener: one starlette app served by hypercorn's trio worker in the broker's
nursery (``broker.background_tasks``), on ``Config.http_host``:``Config.http_port``.

Routes come from ``broker.http_routes``: features append starlette ``Route``/``Mount``
objects to it at install time; the app is built from the list when the listener starts,
followed by the web console's static files at "/" (a catch-all, so it goes last).

Limits (docs/management.md): a request body above ``http_max_body`` gets 413, a body not
received within ``http_timeout`` gets 408 and the connection is dropped, bodies held at once
over all requests are capped (503), each socket read waits at most ``http_timeout`` and idle
keep-alive connections close after 5 s. HTTP work runs on the same loop as AMQP, so handlers
stay short and never wait for clients. Request bodies are JSON read by ``parse_json``.
"""
from __future__ import annotations

import errno
import http
import json
import logging
import math
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h11
import hypercorn.protocol.h11 as _hyper_h11
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..malloc import trim

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..broker import Broker
    from ..config import Config
    from ..recovery_progress import RecoveryProgress

log = logging.getLogger("broker.management")

CONSOLE_DIR = Path(__file__).with_name("console")

# RabbitMQ's error bodies: {"error": ..., "reason": ...}
_STATUS_ERRORS = {
    400: "bad_request",
    401: "not_authorized",
    403: "not_authorised",
    404: "Object Not Found",
    405: "method_not_allowed",
    408: "timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    503: "service_unavailable",
}


class HttpListenError(Exception):
    """The HTTP port could not be bound (one line: address and reason)."""


class ApiError(HTTPException):
    """An HTTP error with RabbitMQ's JSON body ``{"error": ..., "reason": ...}``."""

    def __init__(self, status: int, reason: str, error: str | None = None,
                 headers: dict | None = None):
        super().__init__(status, reason, headers)
        self.error = error or _STATUS_ERRORS.get(status, "error")
        self.reason = reason


def error_response(status: int, reason: str, error: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error or _STATUS_ERRORS.get(status, "error"), "reason": reason},
                        status_code=status, headers=headers)


MAX_JSON_DEPTH = 64  # nesting of any request body; real documents need fewer than 10 levels
# objects and arrays per byte of body: a definitions file has one per 40 bytes or more; "{},"
# repeated has one per 3, each a 64-byte dict: 20 MiB of it decode to 500 MB
JSON_BYTES_PER_CONTAINER = 16
_SMALL_JSON = 64 << 10  # bodies up to this size are decoded whatever their shape
_INT_RANGE = (-(1 << 63), (1 << 63) - 1)  # what an AMQP table or a limit can hold


class JsonRejected(ValueError):
    """A request body that is not acceptable JSON; the text names the problem and, for a
    value, its place (``arguments.x-max-length``)."""


def parse_json(raw: bytes) -> Any:
    """The JSON document in ``raw``, refused (``JsonRejected``) when malformed, nested
    deeper than ``MAX_JSON_DEPTH``, or holding a number no field can take (non-finite,
    or an integer outside 64 bits): such values would otherwise fail later, far from the
    request, or be stored and break every later export. Also refused before decoding, past
    64 KiB: more than one object or array per ``JSON_BYTES_PER_CONTAINER`` bytes (counted at
    C speed, brackets inside strings too), whose decoded form would take tens of times the
    body."""
    if len(raw) > _SMALL_JSON:
        containers = raw.count(b"{") + raw.count(b"[")
        if containers > len(raw) // JSON_BYTES_PER_CONTAINER:
            try:  # say "nested" when that is what it is: the decoder stops early on depth
                json.loads(raw[:_SMALL_JSON])
            except RecursionError:
                raise JsonRejected(f"not_json: nested deeper than {MAX_JSON_DEPTH} levels") \
                    from None
            except ValueError:
                pass
            raise JsonRejected(f"not_json: {containers} objects and arrays in {len(raw)} bytes "
                               f"(at most one per {JSON_BYTES_PER_CONTAINER} bytes)")
    try:
        data = json.loads(raw)
    except RecursionError:
        # the C decoder recurses per level; a hostile depth stops it here, not the broker
        raise JsonRejected(f"not_json: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise JsonRejected("not_json: not UTF-8") from None
    except json.JSONDecodeError:
        raise JsonRejected("not_json") from None  # RabbitMQ's reason, word for word
    except ValueError:  # Python refuses integer literals of more than 4300 digits
        raise JsonRejected("not_json: number out of range") from None
    _check_values(data)
    return data


def _check_values(data: Any) -> None:
    # iterative, so the walk cannot recurse on hostile input; a stack of iterators, one per
    # open container, so it holds at most MAX_JSON_DEPTH of them whatever the width (an array
    # of millions of objects); no paths are built on the way: only when a value is refused
    # does a second walk find where it is
    lo, hi = _INT_RANGE
    bare = type(data) is not dict and type(data) is not list
    top = [data] if bare else data  # a bare number is checked as an element of nothing
    if _flat_and_fine(top):
        return
    stack = [iter(top.values() if type(top) is dict else top)]
    while stack:
        for item in stack[-1]:
            kind = type(item)
            if kind is dict or kind is list:
                if len(stack) >= MAX_JSON_DEPTH:
                    raise JsonRejected(f"not_json: nested deeper than {MAX_JSON_DEPTH} levels")
                if _flat_and_fine(item):
                    continue
                stack.append(iter(item.values() if kind is dict else item))
                break
            if (kind is int and not lo <= item <= hi) or (
                    kind is float and not math.isfinite(item)):
                path = _path_to(top, item)[1 if bare else 0:]
                raise JsonRejected(f"field '{_dotted(path)}': number out of range")
        else:
            stack.pop()


def _flat_and_fine(container: dict | list) -> bool:
    """True for a long container of scalars only, none of them a number out of range,
    decided at C speed (the walk's per-element loop costs 3 times as much on 10M ints);
    False sends it through the walk."""
    values = container.values() if type(container) is dict else container
    if len(values) < 64:
        return False
    kinds = set(map(type, values))
    if dict in kinds or list in kinds:
        return False
    if int in kinds:
        if kinds - _SCALARS_BUT_FLOAT:
            return False  # ints mixed with floats: the walk checks each
        ints = values if kinds == {int} else [v for v in values if type(v) is int]
        return not ints or (min(ints) >= _INT_RANGE[0] and max(ints) <= _INT_RANGE[1])
    return float not in kinds


_SCALARS_BUT_FLOAT = {int, str, bool, type(None)}


def _path_to(data: Any, target: Any) -> tuple:
    """The keys leading to ``target`` (the object itself) in ``data``."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        items = value.items() if type(value) is dict else enumerate(value)
        for key, item in items:
            if item is target:
                return (*path, key)
            if type(item) is dict or type(item) is list:
                stack.append((item, (*path, key)))
    return ()


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path) or "(document)"


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, exc.reason, exc.error, exc.headers)
    if exc.status_code == 404:
        return error_response(404, "Not Found")
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


TRIM_AFTER = 1 << 20  # request body bytes after which the heap is trimmed
# request body bytes held at once over all connections: 4 bodies of the largest size (a
# handler holds a body and its decoded copy), and never less than this floor
BODIES_IN_FLIGHT_MIN = 64 << 20
# the first bytes of each body are not counted: ordinary small requests are never refused
# while big ones fill the budget (each connection may hold this much, as its headers)
UNCOUNTED = 64 << 10


def _counted(received: int) -> int:
    return max(0, received - UNCOUNTED)


class BodyBudget:
    """Request body bytes held at once over every HTTP request of the broker (management
    port and Hermes frontend): ``limit`` = 4 x the largest body, ``BODIES_IN_FLIGHT_MIN`` at
    least, each body's first ``UNCOUNTED`` bytes free. The number of connections is not
    capped; the memory their bodies take is."""

    def __init__(self, max_body: int):
        self.limit = max(4 * max_body, BODIES_IN_FLIGHT_MIN)
        self.held = 0

    def grew(self, before: int, after: int) -> bool:
        """A body went from ``before`` to ``after`` bytes received; False if that passes
        the limit (the caller answers 503 and later calls ``done`` as for any body)."""
        self.held += _counted(after) - _counted(before)
        return after <= UNCOUNTED or self.held <= self.limit

    def done(self, received: int) -> None:
        """A request that had received ``received`` body bytes is over."""
        self.held -= _counted(received)
        if received >= TRIM_AFTER:
            # a big body's copies (chunks, joined, decoded) were reused heap pages that the
            # periodic check would not count as newly free: give them back now
            trim()

    def refusal(self) -> str:
        return f"request bodies being received exceed {self.limit} bytes; retry later"


class RecoveryGate:
    """While the broker reads its stores back (the listener opens first), reads of its
    state are served at once -- the overview with the ``recovery`` progress, /metrics,
    the health checks. Any other request waits, as an AMQP connection does, and is served
    when recovery ends (a declare or a publish now would race the definitions and
    messages being restored); one still waiting after ``HOLD`` seconds answers 503 with
    the progress, so no client hangs on a long recovery."""

    READS = ("/api/overview", "/metrics", "/api/health", "/api/whoami")
    HOLD = 20.0
    POLL = 0.05

    def __init__(self, app, recovery):
        self.app = app
        self.recovery = recovery

    async def __call__(self, scope, receive, send):
        recovery = self.recovery
        if scope["type"] != "http" or recovery.ready or (
                scope["method"] in ("GET", "HEAD") and scope["path"].startswith(self.READS)):
            return await self.app(scope, receive, send)
        with trio.move_on_after(self.HOLD):
            while not recovery.ready:  # noqa: ASYNC110 - RecoveryProgress has no trio
                await trio.sleep(self.POLL)
        if recovery.ready:
            return await self.app(scope, receive, send)
        running = "; ".join(p.describe() for p in recovery.running_phases())
        body = json.dumps({"error": "service_unavailable",
                           "reason": f"broker is recovering ({running or 'starting'}); "
                                     f"retry later"}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": body})


class LimitsMiddleware:
    """Request bodies: at most ``max_body`` bytes, all of it within ``timeout`` seconds, and
    within the broker's ``BodyBudget`` (503 past it)."""

    def __init__(self, app, max_body: int, timeout: float, bodies: BodyBudget):
        self.app = app
        self.max_body = max_body
        self.timeout = timeout
        self.bodies = bodies

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("raw_path")
        if raw and scope["path"].startswith("/api/"):
            # match /api paths still percent-encoded: a vhost "%2F" is one path segment
            path = raw.split(b"?", 1)[0].decode("latin-1")
            # as RabbitMQ's router: a trailing "/" is ignored ("/api/queues/" lists them all)
            if len(path) > len("/api/") and path.endswith("/"):
                path = path[:-1]
            scope = dict(scope, path=path)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return await self._refuse(send, 400, "invalid content-length")
                if length > self.max_body:
                    return await self._refuse(send, 413, f"request body larger than "
                                                         f"{self.max_body} bytes")
        deadline = trio.current_time() + self.timeout
        received = 0
        # a request body must arrive whole within ``timeout`` (slow clients are cut off)

        async def limited_receive():
            nonlocal received
            remaining = deadline - trio.current_time()
            with trio.move_on_after(max(remaining, 0)):
                message = await receive()
                if message["type"] == "http.request":
                    before = received
                    received += len(message.get("body", b""))
                    within = self.bodies.grew(before, received)
                    if received > self.max_body:
                        raise ApiError(413, f"request body larger than {self.max_body} bytes",
                                       headers={"connection": "close"})
                    if not within:
                        raise ApiError(503, self.bodies.refusal(),
                                       headers={"connection": "close", "retry-after": "1"})
                return message
            raise ApiError(408, f"request body not received within {self.timeout:g} s",
                           headers={"connection": "close"})

        # the app's exception handler turns the ApiError raised in receive into its answer
        try:
            await self.app(scope, limited_receive, send)
        finally:
            self.bodies.done(received)

    @staticmethod
    async def _refuse(send, status: int, reason: str) -> None:
        body = json.dumps({"error": _STATUS_ERRORS.get(status, "error"), "reason": reason}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


async def _api_not_found(request: Request) -> Response:
    return error_response(404, "Not Found")


def build_app(broker: Broker) -> Starlette:
    routes = list(broker.http_routes)
    # unknown /api paths answer RabbitMQ's JSON 404, not the console's HTML
    routes.append(Route("/api/{rest:path}", _api_not_found,
                        methods=["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"]))
    if CONSOLE_DIR.is_dir():
        routes.append(Mount("/", app=StaticFiles(directory=str(CONSOLE_DIR), html=True),
                            name="console"))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})
    app.state.broker = broker
    return app


class _SendRaceFilter(logging.Filter):
    """Drops hypercorn's "Error in ASGI Framework" for trio's BusyResourceError: its trio
    server closes a connection (after an answer with "connection: close", e.g. a 413 while the
    client still sends its body) without the lock its writer holds. The client has its
    answer; a traceback per hostile request would only let clients fill the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, trio.BusyResourceError)


class _H11WithReasons:
    """The h11 module as hypercorn's HTTP/1.1 protocol sees it, with a reason phrase on each
    status line: ASGI carries none, and hypercorn sends ``HTTP/1.1 401 `` where RabbitMQ (and
    clients that show or check it) have ``401 Unauthorized``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(h11, name)

    @staticmethod
    def Response(**fields: Any) -> h11.Response:
        if not fields.get("reason"):
            try:
                fields["reason"] = http.HTTPStatus(fields["status_code"]).phrase.encode()
            except ValueError:
                pass
        return h11.Response(**fields)


_hyper_h11.h11 = _H11WithReasons()  # type: ignore[assignment]

_HYPERCORN_LOG = logging.getLogger("broker.management.hypercorn")
_HYPERCORN_LOG.addFilter(_SendRaceFilter())


class _TLSConfig(HyperConfig):
    """hypercorn's config with the broker's TLS context (TLS 1.2/1.3, client certificates
    as --tls-verify says) instead of one built from file names."""

    def __init__(self, context):
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self):
        return self._context


class HttpServer:
    """The broker's HTTP listener. ``port`` is the bound port once ``run`` has started.
    It binds once ``amqp_listening`` is set, answers 503 while ``recovery`` runs, and serves
    the app ``app()`` builds (the routes the features appended by then)."""

    def __init__(self, config: Config, recovery: RecoveryProgress, amqp_listening: trio.Event,
                 app: Callable[[], Starlette]):
        self.config = config
        self.recovery = recovery
        self.amqp_listening = amqp_listening
        self.app = app
        self.port: int | None = None
        self.amqp_port: int | None = None  # the AMQP listener's, once it listens
        # body bytes held over all requests, the Hermes frontend's too
        self.bodies = BodyBudget(config.http_max_body)
        self.started = trio.Event()

    def bind(self) -> socket.socket:
        """The listening socket on the configured address; OSError says why not."""
        config = self.config
        configured = config.http_host if config.http_host is not None else config.host
        host = None if configured in ("", "*") else configured
        last: OSError | None = None
        for family, kind, proto, _, addr in socket.getaddrinfo(
                host, config.http_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if config.reuse_port:  # --workers: every process listens here
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(addr)
                sock.listen(128)
                sock.setblocking(False)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last or OSError(errno.EADDRNOTAVAIL, f"no address for {host}")

    async def run(self) -> None:
        config = self.config
        host = config.http_host if config.http_host is not None else config.host
        # bind once AMQP listens: a broker that cannot serve AMQP stops with that one error
        await self.amqp_listening.wait()
        try:
            sock = self.bind()
        except OSError as exc:
            reason = {errno.EADDRINUSE: "address already in use",
                      errno.EACCES: "permission denied"}.get(exc.errno or 0, exc.strerror or str(exc))
            text = f"cannot listen on {host}:{config.http_port} (HTTP): {reason}"
            if config.http_optional:
                # said once the broker serves: one that cannot open its store (read back
                # while this binds) stops with that one error line
                while not self.recovery.ready:  # noqa: ASYNC110 - until recovered
                    await trio.sleep(0.1)
                log.warning("%s; the management HTTP API is not served (--http-port)", text)
                return
            raise HttpListenError(text) from None
        self.port = sock.getsockname()[1]
        if config.http_tls:
            from ..security.tls import TLSConfigError, server_context
            try:
                context = server_context(config)
            except TLSConfigError as exc:
                sock.close()
                raise HttpListenError(f"HTTP listener: {exc}") from None
            context.set_alpn_protocols(["http/1.1"])
            hyper: HyperConfig = _TLSConfig(context)
            sockets = Sockets([sock], [], [])
        else:
            hyper = HyperConfig()
            sockets = Sockets([], [sock], [])
        hyper.accesslog = None
        hyper.errorlog = _HYPERCORN_LOG
        hyper.read_timeout = math.ceil(config.http_timeout)
        hyper.keep_alive_timeout = 5
        hyper.graceful_timeout = 1
        hyper.h11_max_incomplete_size = 16 * 1024
        app = RecoveryGate(LimitsMiddleware(self.app(), config.http_max_body,
                                            config.http_timeout, self.bodies),
                           self.recovery)
        log.info("management HTTP API listening on %s:%s", host, self.port)
        started = self.started

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            await worker_serve(wrap_app(app, hyper.wsgi_max_body_size, "asgi"), hyper,
                               sockets=sockets, task_status=task_status)

        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            started.set()
