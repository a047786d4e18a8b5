"""Receiving the body frames of a large content straight into its body: a scattering read.

A content of more than one frame comes as body frames back to back: octet 0xCE ending one,
the next one's 7-octet header, its payload. When the frame buffer is empty at such a
boundary, the edge can read the next frames with one ``recvmsg_into``: each boundary into a
small buffer of its own, each payload straight into the body where it belongs, and the frame
buffer last, for what follows. The boundaries that arrived are then checked against the
frames expected; whatever differs (another channel's frame in between, a heartbeat, a frame
of another size) is put back in the frame buffer in order, from the first difference on, and
parsed as usual. The body grows as before (never past twice what arrived), so a scattering
read holds no more than the frame-by-frame one.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from .codec import FRAME_BODY, FrameReader

if TYPE_CHECKING:
    from .connection import _ChannelState

CH_OPEN = 1  # a channel's state once open (connection.py)
_BODY_HEAD = struct.Struct(">BHI")
SCATTER_FRAMES = 32  # body frames expected by one read at most
TAIL_MIN = 4096  # the frame buffer's share of a scattering read, at least


class _Plan:
    __slots__ = ("body", "ch", "channel", "expected", "fb_at", "fb_len", "frames", "gaps",
                 "start")

    def __init__(self, ch: _ChannelState, channel: int, body: bytearray,
                 frames: list[tuple[int, int]], expected: bytes) -> None:
        self.ch = ch
        self.channel = channel
        self.body = body
        self.start = ch.received  # where the first expected payload goes in the body
        self.frames = frames  # (boundary octets, payload octets) of each expected frame
        self.expected = expected  # the boundaries, end to end
        self.gaps = bytearray(len(expected))
        self.fb_at = 0  # where the frame buffer's part starts in the reader's buffer
        self.fb_len = 0


class BodyScatter:
    """Mixed into ``ServerConnection``: ``get_buffers`` and what ``buffer_updated`` does
    with a scattering read."""
    _reader: FrameReader
    channels: dict[int, _ChannelState]
    frame_max: int
    partial_bytes: int
    max_partial_bodies: int
    _plan: _Plan | None
    _receiving: int  # the channel whose content header or body frame came last

    if TYPE_CHECKING:
        def get_buffer(self, size: int) -> memoryview: ...

        def _grow(self, ch: _ChannelState, need: int, exact: bool = False) -> bytearray: ...

    def _plan_scatter(self, size: int) -> _Plan | None:
        reader = self._reader
        part_left = reader.part_left
        if reader.buffered or part_left > 0 or self.frame_max <= 8:
            return None
        channel = reader.part_channel if part_left == 0 else self._receiving
        ch = self.channels.get(channel)
        if ch is None or ch.body is None or ch.pending is None or ch.state != CH_OPEN:
            return None
        received, body_size = ch.received, ch.body_size
        room = min(body_size, max(len(ch.body), 2 * received))
        if room > len(ch.body):
            if self.partial_bytes + room - len(ch.body) > self.max_partial_bodies:
                return None
            self._grow(ch, room, exact=True)
        chunk = self.frame_max - 8
        frames: list[tuple[int, int]] = []
        heads = []
        at, total = received, 0
        end_first = part_left == 0
        while at < room and total < size and len(frames) < SCATTER_FRAMES:
            payload = min(chunk, body_size - at)
            if at + payload > room:
                break
            head = _BODY_HEAD.pack(FRAME_BODY, channel, payload)
            if frames or end_first:
                head = b"\xce" + head
            frames.append((len(head), payload))
            heads.append(head)
            at += payload
            total += len(head) + payload
        if not frames:
            return None
        return _Plan(ch, channel, ch.body, frames, b"".join(heads))

    def get_buffers(self, size: int) -> list[memoryview]:
        """Where to receive the next octets, for a scattering read (``recvmsg_into``): the one
        buffer of ``get_buffer``, or, at a frame boundary inside a large body, each expected
        frame's boundary and payload (module docstring) then the frame buffer; report the
        octets received with ``buffer_updated``."""
        self._plan = None
        plan = self._plan_scatter(size) if size > TAIL_MIN else None
        if plan is None:
            return [self.get_buffer(size)]
        bufs = []
        gaps = memoryview(plan.gaps)
        body = memoryview(plan.body)
        g, at = 0, plan.start
        for gap, payload in plan.frames:
            bufs.append(gaps[g:g + gap])
            bufs.append(body[at:at + payload])
            g += gap
            at += payload
        tail = self._reader.get_buffer(max(TAIL_MIN, size - g - (at - plan.start)))
        plan.fb_at = self._reader.free_at
        plan.fb_len = len(tail)
        bufs.append(tail)
        self._plan = plan
        return bufs

    def _scatter_updated(self, plan: _Plan, nbytes: int) -> None:
        """``nbytes`` octets arrived in the buffers ``get_buffers`` gave for ``plan``."""
        reader = self._reader
        ch = plan.ch
        left = nbytes
        g = 0
        expected, gaps = plan.expected, plan.gaps
        intact = ch.body is plan.body and ch.pending is not None and ch.state == CH_OPEN \
            and ch.received == plan.start
        for i, (gap, payload) in enumerate(plan.frames):
            if not intact or left < gap or gaps[g:g + gap] != expected[g:g + gap]:
                self._put_back(plan, i, left)
                return
            g += gap
            left -= gap
            got = min(left, payload)
            ch.received += got
            left -= got
            reader.set_part(plan.channel, payload - got)
            if got < payload:
                return  # the read ended inside this payload: its rest comes straight in too
        reader.buffer_updated(left)  # what followed the frames, in the frame buffer

    def _put_back(self, plan: _Plan, frame: int, left: int) -> None:
        """The octets of frames ``frame`` on were not the frames expected (or the content
        ended meanwhile): into the frame buffer in the order they came, parsed as usual."""
        parts = []
        g = sum(gap for gap, _payload in plan.frames[:frame])
        at = plan.start + sum(payload for _gap, payload in plan.frames[:frame])
        body = plan.body
        for gap, payload in plan.frames[frame:]:
            take = min(left, gap)
            parts.append(bytes(plan.gaps[g:g + take]))
            left -= take
            take = min(left, payload)
            parts.append(bytes(body[at:at + take]))
            left -= take
            g += gap
            at += payload
        if left:
            parts.append(self._reader.peek_at(plan.fb_at, min(left, plan.fb_len)))
        self._reader.append(b"".join(parts))  # (copied out first: it may overwrite the tail)


__all__ = ["CH_OPEN", "BodyScatter"]
