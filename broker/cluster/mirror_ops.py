"""The ops a queue's master sends its mirrors over the link: op codes, the header field and
how bodies are packed (the link's wire format). Not what an op does: ``mirror_copy.py``
applies them, ``mirror_master.py`` produces them."""
from __future__ import annotations

import struct

MIRROR_HEADER = "x-triomq-mirror"
RESET = 0  # op code: start a copy of this epoch (empty)
SYNCED = 99  # op code: the snapshot is complete
LEAVES = 50  # op code: the entries of these seqs left the queue (the seqs: the route key)
ENQUEUES = 51  # op code: these messages entered the queue (body: ``pack_entries``)
LEFT = 52  # op code: the entries of these seqs left the queue (body: ``pack_seqs``)
# op code: a catch-up from the mirror's own copy starts (body: the highest seq the mirror
# has, then the seqs up to it the queue still holds: the others left while it was away)
KEEP = 53
# op code: these entries came back to the queue (nack/reject with requeue, a consumer
# gone): their delivery counts (body: ``pack_counts``), so that x-delivery-count and the
# delivery limit carry on across a failover (a quorum queue's)
RETURNED = 54
_REC = struct.Struct(">QHHII")
_SEQ = struct.Struct(">Q")
_COUNT = struct.Struct(">QI")
# An op is one message on the link: its body is cut in frames of the negotiated size, but
# each op stays well under the largest message a node takes, so a purge or an ack of
# tens of thousands of messages goes as several ops (the seqs once went in a header: one
# frame, which a purge of 30,001 messages made larger than the frame size).
_SEQS_PER_OP = 16384  # 128 KiB of seqs
_OP_BYTES = 8 << 20  # messages packed per op (one larger message goes alone)


def pack_seqs(seqs) -> bytes:
    return b"".join(_SEQ.pack(seq) for seq in seqs)


def unpack_seqs(data: bytes) -> list[int]:
    if len(data) % _SEQ.size:
        raise struct.error("truncated seqs")
    return [s for (s,) in _SEQ.iter_unpack(data)]


def pack_counts(counts: dict[int, int]) -> bytes:
    return b"".join(_COUNT.pack(seq, min(n, 0xFFFFFFFF)) for seq, n in counts.items())


def unpack_counts(data: bytes) -> list[tuple[int, int]]:
    if len(data) % _COUNT.size:
        raise struct.error("truncated counts")
    return list(_COUNT.iter_unpack(data))


def pack_copy(entries: dict) -> bytes:
    """A copy's entries (seq -> (exchange, routing key, raw properties, body)) packed as
    ``pack_entries`` packs queue entries."""
    parts = []
    for seq, (exchange, key, props, body) in entries.items():
        ex = exchange.encode("utf-8", "surrogateescape")
        rk = key.encode("utf-8", "surrogateescape")
        parts += [_REC.pack(seq, len(ex), len(rk), len(props), len(body)), ex, rk, props, body]
    return b"".join(parts)


def seq_chunks(seqs: list[int]) -> list[bytes]:
    """``seqs`` packed in ops of at most ``_SEQS_PER_OP``."""
    return [pack_seqs(seqs[i:i + _SEQS_PER_OP]) for i in range(0, len(seqs), _SEQS_PER_OP)]


def entry_chunks(entries) -> list[bytes]:
    """``entries`` packed in ops of about ``_OP_BYTES`` at most (at least one entry each)."""
    out: list[bytes] = []
    chunk: list = []
    size = 0
    for e in entries:
        n = len(e.message.body) + len(e.message.props_raw) + 600
        if chunk and size + n > _OP_BYTES:
            out.append(pack_entries(chunk))
            chunk, size = [], 0
        chunk.append(e)
        size += n
    if chunk:
        out.append(pack_entries(chunk))
    return out


def pack_entries(entries) -> bytes:
    """Entries as one body: per entry seq, exchange, routing key, raw properties, body."""
    parts = []
    for e in entries:
        m = e.message
        ex = m.exchange.encode("utf-8", "surrogateescape")
        rk = m.routing_key.encode("utf-8", "surrogateescape")
        parts += [_REC.pack(e.seq, len(ex), len(rk), len(m.props_raw), len(m.body)), ex, rk,
                  m.props_raw, m.body]
    return b"".join(parts)


def unpack_entries(data: bytes):
    """``pack_entries`` back: (seq, (exchange, routing key, raw properties, body))."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        seq, nx, nk, np_, nb = _REC.unpack_from(view, pos)
        pos += _REC.size
        ex = bytes(view[pos:pos + nx]).decode("utf-8", "surrogateescape")
        pos += nx
        rk = bytes(view[pos:pos + nk]).decode("utf-8", "surrogateescape")
        pos += nk
        props = bytes(view[pos:pos + np_])
        pos += np_
        body = bytes(view[pos:pos + nb])
        pos += nb
        yield seq, (ex, rk, props, body)
