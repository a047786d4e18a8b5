"""Messages of unacked deliveries kept by journal location only (``StoredMessage``), read
back on first use, and the heap trim after paging them out. Does not decide when to page."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...message import Message

if TYPE_CHECKING:
    from ...queues.entry import QueueEntry
    from .shared import JournalStoreState


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        import ctypes
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]

    def release() -> None:
        trim(0)
    return release


# Body lengths above 256 are int objects of their own (28 B each, a twentieth of what a
# paged-out delivery still costs): StoredMessages share one per length, for this many
# distinct lengths (messages of one application mostly have a few).
SHARED_LENGTHS = 4096
_lengths: dict[int, int] = {}


def _shared_length(n: int) -> int:
    got = _lengths.get(n)
    if got is not None:
        return got
    if len(_lengths) < SHARED_LENGTHS:
        _lengths[n] = n
    return n


# Message's slot descriptors, which StoredMessage's properties shadow: the record's payload,
# read back whole, and its names (id, exchange, routing key), read from its header alone
_SLOTS: dict[str, Any] = {name: Message.__dict__[name] for name in ("body", "properties", "props_raw")}
_NAMES: dict[str, Any] = {name: Message.__dict__[name] for name in ("id", "exchange", "routing_key")}
_ANY = {**_SLOTS, **_NAMES}
_ID, _EXCHANGE, _KEY = _NAMES["id"], _NAMES["exchange"], _NAMES["routing_key"]


class StoredMessage(Message):
    """The message of a delivery left unacknowledged, kept by its journal location only.

    Body, properties and raw properties are read back from the journal on first use (a
    requeue, a dead letter) and kept from then on; id, exchange, routing key and
    persistence stay in memory, so an ack reads nothing. A consumer holding many
    deliveries then costs about what a paged queue entry does, not its payload. The
    message of a parked delivery taken back (``make``) has not even those: id, exchange
    and routing key are read from the record's header on first use (an ack needs none).

    Each store makes its own subclass (``for_store``) holding the store as a class
    attribute: a slot less per delivery puts the object in a smaller allocator class
    (112 B instead of 128).
    """

    __slots__ = ("_blen", "_loc")
    _blen: int
    _loc: int
    _store: JournalStoreState

    @classmethod
    def for_store(cls, store: JournalStoreState) -> type[StoredMessage]:
        return type(cls.__name__, (cls,), {"__slots__": (), "_store": store})

    @classmethod
    def of(cls, message: Message, loc: int) -> StoredMessage:
        m = object.__new__(cls)
        _ID.__set__(m, message.id)
        _EXCHANGE.__set__(m, message.exchange)
        _KEY.__set__(m, message.routing_key)
        m.persistent = message.persistent
        m._blen = _shared_length(len(message.body))
        m._loc = loc
        return m

    @classmethod
    def make(cls, blen: int, loc: int) -> StoredMessage:
        """The message of a parked delivery taken back (a persistent one, by definition)."""
        m = object.__new__(cls)
        m.persistent = True
        m._blen = _shared_length(blen)
        m._loc = loc
        return m

    @property
    def size(self) -> int:
        return self._blen

    def set_names(self, msg_id: int, exchange: str, routing_key: str) -> None:
        _ID.__set__(self, msg_id)
        _EXCHANGE.__set__(self, exchange)
        _KEY.__set__(self, routing_key)

    def _slot(self, name: str) -> Any:
        slot = _ANY[name]
        try:
            return slot.__get__(self)
        except AttributeError:  # not read back yet
            if name in _NAMES:
                self.set_names(*self._store._names_at(self._loc))
                return slot.__get__(self)
            real = self._store.read_message(self._loc)
            _SLOTS["body"].__set__(self, real.body)
            _SLOTS["properties"].__set__(self, real.properties)
            _SLOTS["props_raw"].__set__(self, real.props_raw)
            return slot.__get__(self)


def _lazy(name: str) -> property:
    def get(self: StoredMessage) -> Any:
        return self._slot(name)
    return property(get)


for _name in _ANY:  # (set here: a property over a slot of the base class)
    setattr(StoredMessage, _name, _lazy(_name))


def _body_len(entry: QueueEntry) -> int:
    msg = entry.message
    return msg._blen if isinstance(msg, StoredMessage) else len(msg.body)
