"""AMQP 1.0 local transactions (spec part 4), the protocol side, without I/O: the control
messages a client sends on a link to the coordinator (``declare``, ``discharge``) and the
delivery states that carry a transaction's id (``declared``, ``transactional-state``).

What a transaction does to messages is the broker's (``listeners/amqp10_tx.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from proton import Data, Described

# descriptors (spec 4.5)
DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
_NAMES = {"amqp:declare:list": DECLARE, "amqp:discharge:list": DISCHARGE}
# the coordinator's capability a client may ask for; the only kind served
LOCAL_TRANSACTIONS = "amqp:local-transactions"
# a txn-id is the broker's own; a longer one from a client cannot be one
MAX_TXN_ID = 32


@dataclass
class Declare:
    global_id: object  # set: a distributed transaction, which is not supported


@dataclass
class Discharge:
    txn_id: bytes
    fail: bool


class ControlError(ValueError):
    """A message on the coordinator link that is not a declare or a discharge."""


def _descriptor(value) -> int | None:
    d = value.descriptor if isinstance(value, Described) else None
    if isinstance(d, str):
        return _NAMES.get(str(d))
    if isinstance(d, int):
        return int(d)
    return None


def parse_control(data: bytes) -> Declare | Discharge:
    """The control message ``data`` (an amqp-value section holding a described list, after
    any header and annotations). Raises ``ControlError``."""
    d = Data()
    offset = 0
    body = None
    try:
        while offset < len(data):
            n = d.decode(data[offset:] if offset else data)
            if n <= 0:
                break
            offset += n
            d.rewind()
            d.next()
            section = d.get_object()
            d.clear()
            if isinstance(section, Described) and section.descriptor in (0x77, "amqp:amqp-value:*"):
                body = section.value
    except Exception as exc:  # proton's DataException
        raise ControlError(f"the control message does not decode: {exc}") from None
    kind = _descriptor(body)
    fields = body.value if isinstance(body, Described) else None
    if not isinstance(fields, list):
        raise ControlError("expected a declare or discharge in an amqp-value body")
    fields = [*fields, None, None]
    if kind == DECLARE:
        return Declare(fields[0])
    if kind == DISCHARGE:
        txn_id = fields[0]
        if isinstance(txn_id, memoryview):
            txn_id = bytes(txn_id)
        if not isinstance(txn_id, bytes) or len(txn_id) > MAX_TXN_ID:
            raise ControlError("discharge without a valid txn-id")
        return Discharge(txn_id, bool(fields[1]))
    raise ControlError("expected a declare or discharge in an amqp-value body")


def txn_of(fields) -> tuple[bytes | None, int | None]:
    """(txn-id, outcome descriptor) of a transactional-state's fields (proton's
    ``Disposition.data``): the outcome is None when the state carries none."""
    if not isinstance(fields, list) or not fields:
        return None, None
    txn_id = fields[0]
    if isinstance(txn_id, memoryview):
        txn_id = bytes(txn_id)
    if not isinstance(txn_id, bytes):
        return None, None
    outcome = fields[1] if len(fields) > 1 else None
    code = outcome.descriptor if isinstance(outcome, Described) else None
    return txn_id, int(code) if isinstance(code, int) else None
