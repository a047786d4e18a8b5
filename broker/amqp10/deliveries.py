"""The handles of AMQP 1.0 deliveries the broker holds between a transfer and its
settlement, without proton's Python wrappers (their records cost more than the rest of a
delivery). Not the connection that makes them (``connection``).
"""
from __future__ import annotations

from typing import Any

from cproton_ffi import ffi, lib
from proton import Delivery


class Presettled:
    """The delivery of a transfer the client sent settled: proton's is settled on arrival
    (nothing is ever said about it), so this stands in for it."""
    __slots__ = ()
    settled = True

    def settle(self) -> None:
        pass


PRESETTLED = Presettled()


class Sent:
    """A delivery the broker sent: its tag (as proton's ``Delivery.tag`` gives it back in
    the client's disposition)."""
    __slots__ = ("tag",)

    def __init__(self, tag: str):
        self.tag = tag


class Outcome:
    """A delivery the broker sent, as the client's disposition of it comes back: its tag and
    ``settle`` (what the broker uses of it), without a proton wrapper (whose record and two
    dispositions cost more than the rest of the outcome). Holds a reference to it."""
    __slots__ = ("_impl", "tag")

    def __init__(self, impl: Any):
        lib.pn_incref(impl)
        self._impl = impl
        tag = lib.pn_delivery_tag(impl)
        self.tag = ffi.unpack(tag.start, tag.size).decode()

    def settle(self) -> None:
        lib.pn_delivery_settle(self._impl)

    def __del__(self) -> None:
        lib.pn_decref(self._impl)


class Incoming:
    """An unsettled transfer's delivery, until the broker settles it: without a proton
    wrapper unless an outcome needs more than its state (a condition, modified, a
    transaction's). Holds a reference to it."""
    __slots__ = ("_impl",)

    def __init__(self, impl: Any):
        lib.pn_incref(impl)
        self._impl = impl

    @property
    def settled(self) -> bool:
        return bool(lib.pn_delivery_settled(self._impl))

    def settle(self) -> None:
        lib.pn_delivery_settle(self._impl)

    def wrapped(self) -> Delivery:
        return Delivery.wrap(self._impl)

    def __del__(self) -> None:
        lib.pn_decref(self._impl)


def wrapped(d: Any) -> Delivery:
    return d.wrapped() if isinstance(d, Incoming) else d
