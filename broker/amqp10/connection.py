"""One AMQP 1.0 server connection, sans-IO: bytes in (``receive_data``), events out,
bytes out (``data_to_send``).

The frames, the type system, sessions, links, credit and transfers are python-qpid-proton's
engine (``Transport``/``Connection``/``Collector``), which is itself driven by bytes and
has no I/O. In front of it this module runs the protocol header and the SASL exchange
(``sasl.py``); behind it, it turns proton's events into the few the broker acts on and
assembles transfers into whole messages under a size bound. Links and deliveries are
handed out as proton's objects, as opaque handles the broker passes back to the methods
here (``attach_*``, ``send``, ``settle_incoming``, ``grant``, ``detach``, ``close``).
Not here: the events' types (``events``) and the deliveries' handles (``deliveries``).
"""
from __future__ import annotations

import struct
from enum import Enum
from typing import Any

from cproton_ffi import ffi, lib
from proton import (
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Described,
    Disposition,
    Event,
    Link,
    Terminus,
    Transport,
    symbol,
    ulong,
)

from . import sasl
from . import transactions as txn
from .deliveries import PRESETTLED, Incoming, Outcome, Sent, wrapped
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    CreditGiven,
    Event10,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    NoSasl,
    OutcomeReceived,
    ProtocolError,
    SaslInit,
    SessionEnded,
    selector,
)

# Frames the broker accepts (proton refuses larger ones with amqp:connection:framing-error)
MAX_FRAME = 64 * 1024
# proton's incoming window of a session, in frames, is this over MAX_FRAME: 1024 transfers
# may be in flight (a window of a few frames makes a flow frame for every few small
# messages; 128 held a publisher to the round trip of a session flow frame every 128).
# proton holds only octets received and not yet read; they are read at once.
SESSION_CAPACITY = 1024 * MAX_FRAME
CHANNEL_MAX = 255  # sessions per connection
IDLE_TIMEOUT = 60.0  # seconds; a peer that sends nothing for this long is closed
OUTPUT_BATCH = 1024 * 1024  # octets data_to_send hands out at most per call


class State(Enum):
    AWAIT_HEADER = "await_header"
    SASL = "sasl"  # mechanisms sent, waiting for sasl-init
    SASL_DECIDING = "sasl_deciding"  # the broker checks the credentials
    AMQP = "amqp"  # proton's engine has the stream
    CLOSED = "closed"


_DELIVERY_EVENT = lib.PN_DELIVERY
_FLOW_EVENT = lib.PN_LINK_FLOW
_LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE


def _close_frame(condition: str, description: str) -> bytes:
    d = Data()
    d.put_object(Described(ulong(0x18), [Described(ulong(0x1D), [symbol(condition),
                                                                 description])]))
    body = bytes(d.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


class ServerConnection:
    def __init__(self, max_message_size: int, mechanisms: list[str]):
        self.max_message_size = max_message_size
        self.mechanisms = mechanisms
        self.state = State.AWAIT_HEADER
        self._inbuf = bytearray()  # before proton: header and SASL frames only
        self._held = b""  # input proton had no room for yet
        self._close_frame = b""  # written after proton's output (see TRANSPORT_TAIL_CLOSED)
        self._out: list[bytes] = []
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = MAX_FRAME
        self.transport.channel_max = CHANNEL_MAX
        self.transport.idle_timeout = IDLE_TIMEOUT
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.opened = False
        self.username: str | None = None  # set by the broker once logged in
        # octets and reads/writes, as the management API reports connections
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.sasl_used = False
        self.finished = False  # nothing more will be read; write what is left and end
        # a receiving link's partial message: link -> octets so far (bounded, see _read)
        self._partial: dict[int, bytearray] = {}
        # proton hands out a new wrapper object per event: sessions and links get a ``key``
        # attribute (kept in proton's record) to be told apart
        self._keys = 0
        # the link wrappers by their C object's address: transfers and flow frames are read
        # through proton's C API, a wrapper made once per link instead of several per
        # transfer (a wrapper holds a reference: no address is reused while it is here)
        self._links: dict[int, Link] = {}
        self._coordinators: set[int] = set()  # addresses of transaction coordinator links
        self.error: str | None = None

    # ---- input ----
    def receive_data(self, data: bytes) -> list[Event10]:
        events: list[Event10] = []
        if self.finished:
            return events
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state is State.AMQP:
            self._push(data, events)
            return events
        self._inbuf += data
        self._pre_amqp(events)
        return events

    def _pre_amqp(self, events: list[Event10]) -> None:
        buf = self._inbuf
        if self.state is State.AWAIT_HEADER:
            if len(buf) < 8:
                if not (sasl.SASL_HEADER.startswith(buf) or sasl.AMQP_HEADER.startswith(buf)):
                    self._bad_header()
                return
            header = bytes(buf[:8])
            if header == sasl.SASL_HEADER:
                del buf[:8]
                self.sasl_used = True
                self._out.append(sasl.SASL_HEADER + sasl.mechanisms_frame(self.mechanisms))
                self.state = State.SASL
            elif header == sasl.AMQP_HEADER:
                self.state = State.SASL_DECIDING  # the header stays for proton
                events.append(NoSasl())
                return
            else:
                self._bad_header()
                return
        if self.state is State.SASL:
            try:
                parsed = sasl.parse_frame(buf)
                if parsed is None:
                    return
                size, value = parsed
                mechanism, response, hostname = sasl.parse_init(value)
            except sasl.SaslError as exc:
                self._fail(str(exc))
                return
            del buf[:size]
            self.state = State.SASL_DECIDING
            events.append(SaslInit(mechanism, response, hostname))

    def _bad_header(self) -> None:
        # spec 2.2: answer with the header the server supports, then close
        self._out.append(sasl.SASL_HEADER)
        self._fail(f"bad protocol header {bytes(self._inbuf[:8])!r}")

    def _fail(self, why: str) -> None:
        self.error = why
        self.finished = True
        self.state = State.CLOSED
        self._inbuf = bytearray()

    def sasl_outcome(self, ok: bool) -> list[Event10]:
        """The broker's decision on the SASL login (or on a connection without SASL)."""
        events: list[Event10] = []
        without_sasl = not self.sasl_used
        if not without_sasl:
            self._out.append(sasl.outcome_frame(sasl.OK if ok else sasl.AUTH))
        if not ok:
            if without_sasl:
                self._out.append(sasl.SASL_HEADER)  # the header it should have sent
            self._fail("authentication failed")
            return events
        self.state = State.AMQP
        rest, self._inbuf = bytes(self._inbuf), bytearray()
        if rest:
            self._push(rest, events)
        return events

    def _push(self, data: bytes, events: list[Event10]) -> None:
        t = self.transport
        if self._held:
            data, self._held = self._held + data, b""
        view = memoryview(data)
        while view:
            cap = t.capacity()
            if cap == 0:
                self._process(events)  # what was taken from proton frees its buffer
                cap = t.capacity()
                if cap == 0:
                    # proton takes no more now: kept (bounded by what was received) for
                    # the next call
                    self._held = bytes(view)
                    break
            if cap < 0:
                break  # the input side is closed: the rest is discarded
            n = min(cap, len(view))
            try:
                t.push(bytes(view[:n]))
            except Exception as exc:  # proton's TransportException
                self.error = str(exc)
                break
            view = view[n:]
            self._process(events)
        self._process(events)

    def _link(self, impl: Any) -> Link:
        addr = int(ffi.cast("uintptr_t", impl))
        link = self._links.get(addr)
        if link is None:
            link = self._links[addr] = Link.wrap(impl)
        return link

    def _forget(self, link: Link) -> None:
        addr = int(ffi.cast("uintptr_t", link._impl))
        self._links.pop(addr, None)
        self._coordinators.discard(addr)

    # ---- proton's events ----
    def _process(self, events: list[Event10]) -> None:
        col = self.collector._impl
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        null = ffi.NULL
        while True:
            raw = peek(col)
            if raw == null:
                break
            etype_n = event_type(raw)
            # the per-message events through the C API (no event wrapper), the rest as
            # proton's Python objects
            if etype_n == _DELIVERY_EVENT:
                self._delivery(lib.pn_event_delivery(raw), events)
                pop(col)
                continue
            if etype_n == _FLOW_EVENT:
                impl = lib.pn_event_link(raw)
                if lib.pn_link_is_sender(impl) and lib.pn_link_state(impl) & _LOCAL_ACTIVE:
                    events.append(CreditGiven(self._link(impl)))
                pop(col)
                continue
            # Any: proton types an event's context objects as optional; each event type
            # here has the ones it reads
            ev: Any = Event.wrap(raw)
            etype = ev.type
            if etype == Event.CONNECTION_REMOTE_OPEN:
                c = ev.connection
                events.append(ConnectionOpened(c.remote_hostname, c.remote_container))
            elif etype == Event.SESSION_REMOTE_OPEN:
                s = ev.session
                if s.state & s.LOCAL_UNINIT:
                    self._keys += 1
                    s.key = self._keys
                    s.incoming_capacity = SESSION_CAPACITY
                    s.open()
            elif etype == Event.LINK_REMOTE_OPEN:
                link = ev.link
                if link.state & link.LOCAL_UNINIT:
                    self._keys += 1
                    link.key = self._keys
                    link.session_key = link.session.key
                    term = link.remote_target if link.is_receiver else link.remote_source
                    coordinator = link.is_receiver and term.type == Terminus.COORDINATOR
                    if coordinator:
                        self._coordinators.add(int(ffi.cast("uintptr_t", link._impl)))
                    events.append(LinkAttached(
                        link, term.address, bool(term.dynamic),
                        None if link.is_receiver else selector(term), coordinator))
            elif etype in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
                link = ev.link
                self._forget(link)
                self._partial.pop(link.key, None)
                if link.state & link.LOCAL_ACTIVE:
                    events.append(LinkDetached(link, etype == Event.LINK_REMOTE_CLOSE))
                    if etype == Event.LINK_REMOTE_CLOSE:
                        link.close()
                    else:
                        link.detach()
            elif etype == Event.SESSION_REMOTE_CLOSE:
                s = ev.session
                if s.state & s.LOCAL_ACTIVE:
                    events.append(SessionEnded(s.key))
                    s.close()
            elif etype == Event.CONNECTION_REMOTE_CLOSE:
                if not self.connection.state & Connection.LOCAL_CLOSED:
                    events.append(ConnectionClosed())
                    self.connection.close()
                self.finished = True
            elif etype == Event.TRANSPORT_ERROR:
                cond = self.transport.condition
                desc = f"{cond.name}: {cond.description}" if cond else "transport error"
                self.error = desc
                self.finished = True
                events.append(ProtocolError(desc))
            elif etype == Event.TRANSPORT_TAIL_CLOSED:
                # proton stops reading input it cannot use (an unknown performative, an
                # undecodable frame) without a condition: the close says why
                c = self.connection
                if not c.state & Connection.LOCAL_CLOSED and self.transport.condition is None:
                    self.error = "input proton could not use (framing or decode error)"
                    c.condition = Condition("amqp:decode-error", self.error)
                    if c.state & Connection.LOCAL_UNINIT:
                        c.open()
                    if c.state & Connection.REMOTE_UNINIT:
                        # proton writes no close before the peer's open: written here,
                        # after proton's open
                        self._close_frame = _close_frame("amqp:decode-error", self.error)
                    else:
                        c.close()
                    events.append(ProtocolError(self.error))
                self.finished = True
            elif etype == Event.TRANSPORT_CLOSED:
                self.finished = True
            pop(col)

    def _delivery(self, impl: Any, events: list[Event10]) -> None:
        """A DELIVERY event's delivery (``impl``: proton's C object)."""
        link_impl = lib.pn_delivery_link(impl)
        link = self._link(link_impl)
        if lib.pn_link_is_receiver(link_impl):
            partial = lib.pn_delivery_partial(impl)
            if not lib.pn_delivery_readable(impl) and not partial:
                return
            if not lib.pn_link_state(link_impl) & _LOCAL_ACTIVE:
                return
            if lib.pn_delivery_aborted(impl):
                self._partial.pop(link.key, None)
                lib.pn_delivery_settle(impl)
                return
            key = link.key
            buf = self._partial.get(key)
            pending = lib.pn_delivery_pending(impl)
            chunk = bytearray(pending)
            n = lib.pn_link_recv(link_impl, ffi.from_buffer(chunk), pending)
            if n < pending:
                del chunk[max(n, 0):]
            if buf is None and not partial:
                data = bytes(chunk)
            else:
                if buf is None:
                    buf = self._partial[key] = bytearray()
                if len(buf) + len(chunk) > self.max_message_size:
                    self._partial.pop(key, None)
                    self.detach(link, "amqp:link:message-size-exceeded",
                                f"message size exceeds the maximum of {self.max_message_size} "
                                "bytes")
                    return
                buf += chunk
                if partial:
                    return
                data = bytes(self._partial.pop(key))
            if len(data) > self.max_message_size:
                self.detach(link, "amqp:link:message-size-exceeded",
                            f"message size ({len(data)} bytes) exceeds the maximum of "
                            f"{self.max_message_size} bytes")
                return
            lib.pn_link_advance(link_impl)
            settled = bool(lib.pn_delivery_settled(impl))
            remote_state = lib.pn_delivery_remote_state(impl)
            if settled and not remote_state and \
                    int(ffi.cast("uintptr_t", link_impl)) not in self._coordinators:
                lib.pn_delivery_settle(impl)  # nothing will be said about it
                events.append(MessageReceived(
                    link, PRESETTLED, data, True))  # type: ignore[arg-type]
                return
            if remote_state != txn.TRANSACTIONAL_STATE:
                events.append(MessageReceived(link, Incoming(impl), data,  # type: ignore[arg-type]
                                              settled))
                return
            d = Delivery.wrap(impl)
            txn_id = txn.txn_of(d.remote.data)[0] or b""
            events.append(MessageReceived(link, d, data, settled, txn_id))
            return
        if lib.pn_delivery_updated(impl) or lib.pn_delivery_settled(impl):
            outcome = lib.pn_delivery_remote_state(impl)
            if outcome != txn.TRANSACTIONAL_STATE:
                remote = lib.pn_delivery_remote(impl)
                events.append(OutcomeReceived(
                    link, Outcome(impl), outcome,  # type: ignore[arg-type]
                    bool(lib.pn_disposition_is_failed(remote)),
                    bool(lib.pn_disposition_is_undeliverable(remote))))
                return
            d = Delivery.wrap(impl)
            fields: Any = d.remote.data  # (proton types it as a list of ints)
            held_by, inner = txn.txn_of(fields)
            flags = fields[1].value if inner == Disposition.MODIFIED else None
            flags = [*(flags if isinstance(flags, list) else []), False, False]
            events.append(OutcomeReceived(link, d, inner or 0, bool(flags[0]),
                                          bool(flags[1]), held_by or b""))

    # ---- the broker's answers ----
    def accept_open(self, properties: dict | None = None) -> None:
        c = self.connection
        c.container = "triomq"
        if properties:
            c.properties = properties
        c.open()
        self.opened = True

    def attach_receiver(self, link: Link, address: str | None, credit: int) -> None:
        """Accept a link the client publishes on; ``credit`` transfers may come."""
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
        link.max_message_size = self.max_message_size
        link.open()
        if credit:
            link.flow(credit)

    def attach_coordinator(self, link: Link, credit: int) -> None:
        """Accept a link to the transaction coordinator (local transactions only)."""
        link.source.copy(link.remote_source)
        target = link.target
        target.type = Terminus.COORDINATOR
        caps = target.capabilities
        caps.put_array(False, Data.SYMBOL)
        caps.enter()
        caps.put_symbol(symbol(txn.LOCAL_TRANSACTIONS))
        caps.exit()
        link.open()
        if credit:
            link.flow(credit)

    def settle_declared(self, d: Delivery, txn_id: bytes) -> None:
        """A declare's answer: the ``declared`` state with the new transaction's id."""
        d = wrapped(d)
        local: Any = d.local  # (proton types its data as a list of ints)
        local.data = [txn_id]
        d.update(txn.DECLARED)
        d.settle()

    def settle_transactional(self, d: Delivery, txn_id: bytes, outcome: int) -> None:
        """A transactional transfer's answer: its outcome once the transaction commits."""
        if not d.settled:
            d = wrapped(d)
            local: Any = d.local
            local.data = [txn_id, Described(ulong(outcome), [])]
            d.update(txn.TRANSACTIONAL_STATE)
        d.settle()

    def attach_sender(self, link: Link, address: str | None) -> None:
        """Accept a link the client consumes from, with ``address`` as its source."""
        link.source.copy(link.remote_source)
        if address is not None:
            link.source.address = address
        link.target.copy(link.remote_target)
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            link.snd_settle_mode = Link.SND_SETTLED
        link.open()

    def refuse_link(self, link: Link, condition: str, description: str) -> None:
        """Refuse an attach (spec 2.6.3: attach with a null terminus, then detach)."""
        link.condition = Condition(condition, description)
        link.open()
        link.close()

    def detach(self, link: Link, condition: str | None = None, description: str = "") -> None:
        if condition is not None:
            link.condition = Condition(condition, description)
        if not link.state & link.LOCAL_CLOSED:
            link.close()

    def grant(self, link: Link, credit: int) -> None:
        """Bring a receiving link's credit up to ``credit``."""
        if link.state & link.LOCAL_ACTIVE and credit > link.credit:
            link.flow(credit - link.credit)

    def send(self, link: Link, tag: bytes, payload: bytes, settled: bool) -> Sent:
        """A delivery on a sending link: its tag comes back with the client's disposition
        (``OutcomeReceived.delivery.tag``, a str)."""
        impl = link._impl
        d = lib.pn_delivery(impl, (len(tag), ffi.from_buffer(tag)))
        lib.pn_link_send(impl, ffi.from_buffer(payload), len(payload))
        lib.pn_link_advance(impl)
        if settled:
            lib.pn_delivery_settle(d)
        return Sent(tag.decode())

    def settle_incoming(self, d: Delivery, outcome: int, condition: tuple[str, str] | None = None,
                        undeliverable: bool = False) -> None:
        """The broker's outcome for a message it received (nothing for a presettled one)."""
        if not d.settled:
            if isinstance(d, Incoming):
                if condition is None and outcome != Disposition.MODIFIED:
                    lib.pn_delivery_update(d._impl, outcome)
                    d.settle()
                    return
                d = d.wrapped()
            if condition is not None:
                d.local.condition = Condition(*condition)
            if outcome == Disposition.MODIFIED:
                d.local.undeliverable = undeliverable
            d.update(outcome)
        d.settle()

    def close(self, condition: str | None = None, description: str = "") -> None:
        """Close the connection (with an error condition if given)."""
        c = self.connection
        if self.state is not State.AMQP:
            self._fail(description or "closed")
            return
        if condition is not None:
            c.condition = Condition(condition, description)
        if not c.state & Connection.LOCAL_ACTIVE:
            c.open()  # an open frame must precede the close
        if not c.state & Connection.LOCAL_CLOSED:
            c.close()
        self.finished = True

    # ---- output ----
    def tick(self, now: float) -> float:
        """Idle timeouts (both ways): the time of the next call needed, 0 for none."""
        if self.state is not State.AMQP:
            return 0.0
        deadline = self.transport.tick(now)
        self._process([])  # an expired idle timeout closes the transport
        return deadline

    @property
    def has_output(self) -> bool:
        if self._out or self._close_frame:
            return True
        if self.state is State.AMQP:
            return self.transport.pending() > 0
        return False

    @property
    def done(self) -> bool:
        """Everything was written and nothing more will be: the socket can be closed."""
        if self._out:
            return False
        if self.state is State.AMQP:
            return self.transport.pending() < 0 or (self.finished
                                                     and self.transport.pending() == 0)
        return self.finished

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        if self.state is State.AMQP:
            # proton encodes frames into a buffer of its own as it is emptied: take what a
            # few rounds give (a large delivery's frames), the caller comes back for more
            t = self.transport
            parts = [out]
            size = 0
            while size < OUTPUT_BATCH:
                n = t.pending()
                if n <= 0:
                    break
                parts.append(t.peek(n) or b"")
                t.pop(n)
                size += n
            out = b"".join(parts)
            if self._close_frame and t.pending() <= 0:
                out += self._close_frame
                self._close_frame = b""
        if out:
            self.send_oct += len(out)
            self.send_cnt += 1
        return out

    @property
    def pending_output(self) -> int:
        """Octets queued and not yet handed out by ``data_to_send``."""
        n = sum(len(b) for b in self._out)
        if self.state is State.AMQP:
            n += max(self.transport.pending(), 0)
        return n

    def release(self) -> None:
        self._partial.clear()
        self._links.clear()
        self._coordinators.clear()
        self._inbuf = bytearray()
