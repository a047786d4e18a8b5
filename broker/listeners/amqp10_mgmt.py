"""RabbitMQ 4's management node over AMQP 1.0 (HTTP over AMQP on ``/management``), the
broker's side: a client attaches a link pair (a link to ``/management`` for requests, one
from it for responses, of the same name as RabbitMQ 4 pairs them) and sends requests whose
``subject`` is the HTTP method and ``to`` the path, as RabbitMQ 4's client libraries
(rabbitmq-amqp-python-client, the Java, .NET and Go ones) do:

- ``GET /queues/Q``: the queue's info (200, a map);
- ``PUT /queues/Q`` (durable, exclusive, auto_delete, arguments): 201 created, 200
  existing, 409 not equivalent;
- ``DELETE /queues/Q``, ``DELETE /queues/Q/messages`` (purge): 200, ``message_count``;
- ``PUT /exchanges/X`` (type, durable, auto_delete, internal, arguments), ``DELETE``: 204;
- ``POST /bindings`` (source, destination_queue or _exchange, binding_key, arguments),
  ``DELETE /bindings/src=X;dstq=Q;key=K;args=``: 204;
- ``GET /bindings?src=X&dstq=Q&key=K``: 200, a list.

Permissions and refusals are those of the same operations over 0-9-1 (configure to
declare and delete, write on the destination and read on the source to bind, read to
purge); an error is the status RabbitMQ 4 answers (400, 403, 404, 409) with its text as
the body."""
from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from proton import Disposition, uint, ulong

from .. import errors
from ..amqp10 import management as http
from ..amqp10.events import MessageReceived

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from .amqp10_session import Amqp10Session

log = logging.getLogger("broker.amqp10")

REQUEST_CREDIT = 32  # requests in flight on a link; answers wait for the client's credit
_STATUS = {404: "404", 403: "403", 530: "403", 406: "409", 405: "409"}


def _status(exc: errors.AMQPError) -> str:
    return _STATUS.get(exc.code, "400")


def _text(exc: errors.AMQPError) -> str:
    return exc.text.partition(" - ")[2] or exc.text


def _properties(body, kind: str, known: tuple[str, ...]) -> dict:
    """A declare's body: a map (none: empty) of only the ``known`` properties."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise http.RequestError("400", f"the {kind}'s properties must be a map")
    body = {str(k): v for k, v in body.items()}
    for key in body:
        if key not in known:
            raise http.RequestError("400", f"bad {kind} property {key}")
    return body


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise http.RequestError("400", f"bad property {name}: {value!r}")
    return value


def _args(body: dict) -> dict:
    value = body.get("arguments", {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise http.RequestError("400", f"bad arguments {value!r}")
    return http.plain(value)


def _check_name(name: str) -> None:
    if "\n" in name or "\r" in name:
        raise http.RequestError(
            "400", f"Bad name '{name}': line feed and carriage return characters not allowed")


class ManagementNode:
    """The management link pairs of one connection."""

    def __init__(self, session: Amqp10Session):
        self.session = session
        self.requests: dict[int, Any] = {}  # request links by key
        self.responses: dict[str, Any] = {}  # response links by name
        self.pending: dict[str, deque] = {}  # answers waiting for credit, by link name
        self._tag = 0
        self._store: Any = None  # the store a durable declare's answer waits for

    @property
    def link_count(self) -> int:
        return len(self.requests) + len(self.responses)

    # ---- links ----
    def attach_requests(self, link) -> None:
        self.requests[link.key] = link
        self.session.conn.attach_receiver(link, http.ADDRESS, REQUEST_CREDIT)

    def attach_responses(self, link) -> None:
        self.responses[link.name] = link
        self.pending.setdefault(link.name, deque())
        self.session.conn.attach_sender(link, http.ADDRESS)

    def detached(self, link) -> None:
        if self.requests.pop(link.key, None) is None:
            out = self.responses.get(link.name)
            if out is not None and out.key == link.key:
                del self.responses[link.name]
                self.pending.pop(link.name, None)

    def credit(self, link) -> None:
        name = link.name
        out = self.responses.get(name)
        if out is None or out.key != link.key:
            return
        self._flush(name)
        if link.drain_mode and link.credit > 0:
            link.drained()

    def _flush(self, name: str) -> None:
        out = self.responses.get(name)
        queue = self.pending.get(name)
        if out is None or not queue:
            return
        conn = self.session.conn
        while queue and out.credit > 0:
            self._tag += 1
            conn.send(out, str(self._tag).encode(), queue.popleft(), True)
        self.session.wake()
        if len(queue) < REQUEST_CREDIT:
            # answers waiting for credit hold back the requests they would answer
            for link in self.requests.values():
                if link.name == name:
                    conn.grant(link, REQUEST_CREDIT)

    # ---- requests ----
    def request(self, ev: MessageReceived) -> None:
        session = self.session
        conn = session.conn
        name = ev.link.name
        out = self.responses.get(name)
        if out is None:
            # RabbitMQ 4 pairs the links by name: an answer needs its pair attached first
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 ("amqp:precondition-failed",
                                  f"management link '{name}' has no paired link from "
                                  f"'{http.ADDRESS}'"))
            return
        try:
            req = http.parse_request(ev.data)
        except http.RequestError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 ("amqp:decode-error", exc.text))
            return
        self._store = None
        try:
            status, body = self._handle(req)
        except http.RequestError as exc:
            status, body = exc.status, exc.text
        except errors.AMQPError as exc:
            status, body = _status(exc), _text(exc)
        if not status.startswith("2"):
            log.warning("amqp 1.0 connection %s: request %s %s failed: %s", session.peer,
                        req.method, "/".join(req.segments), body)
        response = http.encode_response(req.message_id, status, body)

        def answer() -> None:
            conn.settle_incoming(ev.delivery, Disposition.ACCEPTED)
            queue = self.pending.get(name)
            if queue is not None:  # (None: the response link went while the answer waited)
                queue.append(response)
                self._flush(name)
        # a durable definition's answer once it is durable, as a queue.declare-ok
        session.answer_when_durable(self._store, answer)

    def _handle(self, req: http.Request) -> tuple[str, object]:
        seg, method = req.segments, req.method
        try:
            names = [http.name_of(s) for s in seg] if seg[:1] != ["bindings"] else seg
        except UnicodeDecodeError:
            raise http.RequestError("400", "bad percent-encoding in the path") from None
        if len(seg) == 2 and seg[0] == "queues":
            if method == "GET":
                return self._queue_info(names[1])
            if method == "PUT":
                return self._declare_queue(names[1], req.body)
            if method == "DELETE":
                return self._delete_queue(names[1])
        elif len(seg) == 3 and seg[0] == "queues" and seg[2] == "messages" \
                and method == "DELETE":
            return self._purge(names[1])
        elif len(seg) == 2 and seg[0] == "exchanges":
            if method == "PUT":
                return self._declare_exchange(names[1], req.body)
            if method == "DELETE":
                return self._delete_exchange(names[1])
        elif seg == ["bindings"]:
            if method == "POST":
                return self._bind(req.body)
            if method == "GET":
                return self._list_bindings(req.query)
        elif len(seg) == 2 and seg[0] == "bindings" and method == "DELETE":
            return self._unbind(seg[1])
        raise http.RequestError("400", f"unsupported request {method} /{'/'.join(seg)}")

    # ---- queues ----
    def _info(self, q: Queue) -> dict:
        return {"message_count": ulong(q.message_count), "consumer_count": uint(q.consumer_count),
                "name": q.name, "vhost": self.session.vhost.name, "durable": q.durable,
                "auto_delete": q.auto_delete, "exclusive": q.exclusive_owner is not None,
                "type": q.queue_type.name, "arguments": dict(q.arguments),
                "leader": "triomq", "replicas": ["triomq"]}

    def _queue_info(self, name: str) -> tuple[str, object]:
        vhost = self.session.vhost
        q = vhost.find_queue(name)
        if q is None:
            raise http.RequestError("404", f"{vhost.queue_resource(name)} not found")
        return "200", self._info(q)

    def _declare_queue(self, name: str, body) -> tuple[str, object]:
        session = self.session
        vhost = session.vhost
        body = _properties(body, "queue", ("durable", "exclusive", "auto_delete", "arguments"))
        durable = _flag(body, "durable", True)
        exclusive = _flag(body, "exclusive", False)
        auto_delete = _flag(body, "auto_delete", False)
        args = _args(body)
        if name == "":
            raise http.RequestError("400", "declare queue with empty name not allowed")
        _check_name(name)
        if name.startswith("amq."):
            raise http.RequestError(
                "403", f"{vhost.queue_resource(name)} starts with reserved prefix 'amq.'")
        existed = vhost.find_queue(name) is not None
        authz = session.authz
        access = session.broker.access

        def authorize(qname: str) -> None:
            authz.check("queue", qname, "configure")
            dlx = args.get("x-dead-letter-exchange")
            if isinstance(dlx, str):
                authz.check("queue", qname, "read")
                authz.check("exchange", dlx, "write")
            if qname not in vhost.queues:
                access.check_queue_limit(vhost, qname)

        if existed:
            authz.check("queue", name, "configure")
        try:
            q = vhost.declare_queue(name, session if exclusive else None, authorize,
                                    durable=durable, auto_delete=auto_delete,
                                    exclusive=exclusive, arguments=args)
        except errors.AMQPError as exc:
            if exc.code == 406:
                raise http.RequestError("409", _text(exc)) from None
            if exc.code in (403, 530, 404):
                raise
            raise http.RequestError("400", _text(exc)) from None
        self._store = q.store
        return ("200" if existed else "201"), self._info(q)

    def _delete_queue(self, name: str) -> tuple[str, object]:
        session = self.session
        vhost = session.vhost
        _check_name(name)
        session.authz.check("queue", name, "configure")
        try:
            count = vhost.delete_queue_checked(name, session)
        except errors.AMQPError as exc:
            raise http.RequestError("400", _text(exc)) from None
        return "200", {"message_count": ulong(count)}

    def _purge(self, name: str) -> tuple[str, object]:
        session = self.session
        session.authz.check("queue", name, "read")
        try:
            q = session.vhost.get_queue(name, session)
        except errors.AMQPError as exc:
            raise http.RequestError("400", _text(exc)) from None
        return "200", {"message_count": ulong(q.purge())}

    # ---- exchanges ----
    def _declare_exchange(self, name: str, body) -> tuple[str, object]:
        session = self.session
        vhost = session.vhost
        body = _properties(body, "exchange",
                           ("type", "durable", "auto_delete", "internal", "arguments"))
        xtype = body.get("type", "direct")
        if not isinstance(xtype, str):
            raise http.RequestError("400", f"bad exchange type {xtype!r}")
        durable = _flag(body, "durable", True)
        auto_delete = _flag(body, "auto_delete", False)
        internal = _flag(body, "internal", False)
        args = _args(body)
        if name == "":
            raise http.RequestError("403", "operation not permitted on the default exchange")
        session.authz.check("exchange", name, "configure")
        if name not in vhost.exchanges:
            _check_name(name)
            if name.startswith("amq."):
                raise http.RequestError(
                    "403", f"{vhost.exchange_resource(name)} starts with reserved prefix 'amq.'")
        try:
            x = vhost.declare_exchange(name, xtype, durable=durable, auto_delete=auto_delete,
                                       internal=internal, arguments=args)
        except errors.AMQPError as exc:
            if exc.code == 406:
                raise http.RequestError("409", _text(exc)) from None
            if exc.code in (403, 530):
                raise
            raise http.RequestError("400", _text(exc)) from None
        self._store = vhost.store if x.durable else None
        return "204", None

    def _delete_exchange(self, name: str) -> tuple[str, object]:
        session = self.session
        _check_name(name)
        if name == "":
            raise http.RequestError("403", "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise http.RequestError(
                "403", f"{session.vhost.exchange_resource(name)} starts with reserved prefix "
                "'amq.'")
        session.authz.check("exchange", name, "configure")
        session.vhost.delete_exchange(name)
        return "204", None

    # ---- bindings ----
    def _authorize_binding(self, kind: str, destination: str, source: str, key: str) -> None:
        # RabbitMQ's binding checks, as Channel._authorize_binding
        session = self.session
        for name in (source, destination):
            _check_name(name)
        if source == "" or (kind == "exchange" and destination == ""):
            raise http.RequestError("403", "operation not permitted on the default exchange")
        authz = session.authz
        authz.check(kind, destination, "write")
        authz.check("exchange", source, "read")
        x = session.vhost.exchanges.get(source)
        if x is not None and authz.topics and x.type_name == "topic":
            authz.check_topic(source, key, "read")

    def _destination(self, kind: str, name: str):
        vhost = self.session.vhost
        if kind == "queue":
            return vhost.get_queue(name, self.session)
        return vhost.get_exchange(name)

    def _bind(self, body) -> tuple[str, object]:
        if not isinstance(body, dict):
            raise http.RequestError("400", "the binding must be a map")
        body = {str(k): v for k, v in body.items()}
        for key in body:
            if key not in ("source", "destination_queue", "destination_exchange",
                           "binding_key", "arguments"):
                raise http.RequestError("400", f"bad binding field {key}")
        source, key = body.get("source"), body.get("binding_key", "")
        if "destination_queue" in body:
            kind, dest = "queue", body["destination_queue"]
        elif "destination_exchange" in body:
            kind, dest = "exchange", body["destination_exchange"]
        else:
            raise http.RequestError("400", "missing destination_queue or destination_exchange")
        if not all(isinstance(v, str) for v in (source, dest, key)):
            raise http.RequestError("400", "source, destination and binding_key are strings")
        args = _args(body)
        self._authorize_binding(kind, dest, source, key)
        vhost = self.session.vhost
        destination = self._destination(kind, dest)
        try:
            vhost.bind(source, destination, key, args)
        except errors.AMQPError as exc:
            if exc.code in (403, 530, 404):
                raise
            raise http.RequestError("400", _text(exc)) from None
        stored = destination.store is not None if kind == "queue" else destination.durable
        if stored and vhost.exchanges[source].durable:
            self._store = vhost.store
        return "204", None

    def _unbind(self, seg: str) -> tuple[str, object]:
        source, kind, dest, key, hashed = http.parse_binding_segment(seg)
        self._authorize_binding(kind, dest, source, key)
        vhost = self.session.vhost
        x = vhost.exchanges.get(source)
        if x is None:
            return "204", None
        for b in list(x.bindings.values()):
            d = b.destination
            if d.kind == kind and d.name == dest and b.routing_key == key \
                    and http.args_hash(b.arguments) == hashed:
                try:
                    vhost.unbind(source, d, key, b.arguments, self.session)
                except errors.AMQPError as exc:
                    raise http.RequestError("400", _text(exc)) from None
        return "204", None

    def _list_bindings(self, query: dict) -> tuple[str, object]:
        source, key = query.get("src"), query.get("key")
        if "dste" in query:
            kind, dest = "exchange", query["dste"]
        elif "dstq" in query:
            kind, dest = "queue", query["dstq"]
        else:
            raise http.RequestError("400", f"missing 'dste' or 'dstq' in query: {query}")
        if source is None or key is None:
            raise http.RequestError("400", "missing 'src' or 'key' in query")
        x = self.session.vhost.exchanges.get(source)
        found = []
        for b in (x.bindings.values() if x is not None else ()):
            d = b.destination
            if d.kind == kind and d.name == dest and b.routing_key == key:
                found.append({"source": source, f"destination_{kind}": dest,
                              "binding_key": key, "arguments": dict(b.arguments),
                              "location": http.binding_location(source, kind, dest, key,
                                                                b.arguments)})
        return "200", found
