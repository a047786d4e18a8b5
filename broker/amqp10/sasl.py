"""The SASL layer of AMQP 1.0 (spec part 5.3), server side, without I/O.

proton's own server SASL only verifies through Cyrus; the broker checks passwords itself
(``broker.access``), so the few SASL frames are handled here: the SASL protocol header,
sasl-mechanisms, sasl-init in, sasl-outcome out. What follows a successful outcome is the
AMQP protocol header and the connection, handed to proton's engine."""
from __future__ import annotations

import struct

from proton import Data, Described, symbol, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_OUTCOME = 0x44
# sasl-code
OK = 0
AUTH = 1
SYS = 2
# a sasl-init is a mechanism, a response and a host name: RabbitMQ reads unauthenticated
# frames of at most 8 KiB before a login as well
MAX_SASL_FRAME = 8192


class SaslError(Exception):
    """The peer broke the SASL exchange: the connection is dropped."""


def frame(body: bytes) -> bytes:
    """One SASL frame (type 1, channel 0) around an encoded performative."""
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def mechanisms_frame(mechanisms: list[str]) -> bytes:
    d = Data()
    d.put_described()
    d.enter()
    d.put_ulong(SASL_MECHANISMS)
    d.put_list()
    d.enter()
    d.put_array(False, Data.SYMBOL)
    d.enter()
    for m in mechanisms:
        d.put_symbol(symbol(m))
    d.exit()
    d.exit()
    d.exit()
    return frame(d.encode())


def outcome_frame(code: int) -> bytes:
    d = Data()
    d.put_object(Described(ulong(SASL_OUTCOME), [_ubyte(code)]))
    return frame(d.encode())


def _ubyte(n: int):
    from proton import ubyte
    return ubyte(n)


def parse_frame(buf: bytes | bytearray) -> tuple[int, object] | None:
    """(octets consumed, the performative's decoded fields) of the first complete SASL
    frame in ``buf``, or None while it is incomplete. Raises ``SaslError``."""
    if len(buf) < 8:
        return None
    size, doff, ftype, _channel = struct.unpack_from(">IBBH", buf)
    if size > MAX_SASL_FRAME or size < 8 or doff < 2 or doff * 4 > size:
        raise SaslError(f"bad SASL frame (size {size}, doff {doff})")
    if ftype != 1:
        raise SaslError(f"frame type {ftype} during SASL")
    if len(buf) < size:
        return None
    body = bytes(buf[doff * 4:size])
    d = Data()
    try:
        d.decode(body)
        d.rewind()
        d.next()
        value = _copied(d.get_object())
    except Exception as exc:  # proton raises DataException and friends
        raise SaslError(f"undecodable SASL frame: {exc}") from None
    return size, value


def _copied(value):
    # binaries decode as views of the Data's buffer, which goes with it
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, Described):
        return Described(value.descriptor, _copied(value.value))
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def parse_init(value) -> tuple[str, bytes, str | None]:
    """(mechanism, initial response, hostname) of a decoded sasl-init."""
    if not isinstance(value, Described) or value.descriptor != SASL_INIT \
            or not isinstance(value.value, list) or not value.value:
        raise SaslError("expected sasl-init")
    fields = [*list(value.value), None, None]
    mechanism, response, hostname = fields[0], fields[1], fields[2]
    if not isinstance(mechanism, str):
        raise SaslError("sasl-init without a mechanism")
    if response is None:
        response = b""
    if not isinstance(response, (bytes, bytearray, memoryview)):
        raise SaslError("sasl-init response is not binary")
    return str(mechanism), bytes(response), hostname if isinstance(hostname, str) else None


def plain_credentials(response: bytes) -> tuple[str, str] | None:
    """(user, password) of a PLAIN response (authzid NUL authcid NUL passwd)."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None
