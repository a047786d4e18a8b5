"""The sans-IO AMQP 0-9-1 connection's output: frames queued for the edge and handed out
joined or for a gathering send; not input, channel state or the handshake (connection.py)."""
from __future__ import annotations

from . import spec
from .codec import (
    GATHER_MIN,
    HEARTBEAT_FRAME,
    OutPart,
    ack_frame,
    content_parts,
    deliver_frames,
    method_frame,
    nack_frame,
    shortstr,
)

_CONTENT_OVERHEAD = 100  # method + header frames, a bound for output accounting


class FrameOutput:
    """Mixed into ``ServerConnection``: its output buffer and what writes into it."""
    _out: list[OutPart]
    _out_size: int
    _out_gather: bool
    send_oct: int
    send_cnt: int
    frame_max: int

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self.send_oct += len(data)
        self.send_cnt += 1
        self._out_size = 0
        self._out_gather = False
        return data

    def buffers_to_send(self) -> list[OutPart]:
        """Everything queued, for a gathering send (``sendmsg``): runs of small parts joined,
        large body parts as slices of the message body, never copied."""
        out = self._out
        if not out:
            return []
        self._out = []
        self.send_cnt += 1
        self._out_size = 0
        if not self._out_gather:
            data = b"".join(out)
            self.send_oct += len(data)
            return [data]
        self._out_gather = False
        bufs: list[OutPart] = []
        run = 0
        for i, part in enumerate(out):
            if len(part) >= GATHER_MIN:
                if i > run:
                    bufs.append(out[run] if i - run == 1 else b"".join(out[run:i]))
                bufs.append(part)
                run = i + 1
        if run < len(out):
            bufs.append(b"".join(out[run:]))
        self.send_oct += sum(map(len, bufs))  # a few parts: large bodies stand alone
        return bufs

    @property
    def pending_output(self) -> int:
        return self._out_size

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)

    def write_many(self, parts: list[OutPart], size: int) -> None:
        self._out.extend(parts)
        self._out_size += size
        if size >= GATHER_MIN:
            self._out_gather = True

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.write(method_frame(channel, method))

    # Content for the client. The frames are built by the codec's pre-encoded fast paths;
    # ``pending_output`` counts the body plus a bound on the frame overhead, so an empty
    # body still counts (and wakes the writer).
    def deliver(self, channel: int, consumer_tag_raw: bytes, delivery_tag: int,
                redelivered: bool, exchange: str, routing_key: str, props_raw: bytes,
                body: bytes) -> None:
        """Queue basic.deliver + content; ``consumer_tag_raw`` is the tag as an encoded shortstr."""
        self.write_many(deliver_frames(channel, consumer_tag_raw, delivery_tag, redelivered,
                                       shortstr(exchange), shortstr(routing_key), props_raw, body,
                                       self.frame_max), len(body) + _CONTENT_OVERHEAD)

    def get_ok(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str,
               routing_key: str, message_count: int, props_raw: bytes, body: bytes) -> None:
        """Queue basic.get-ok + content."""
        self._send_content(channel, spec.Basic.GetOk(delivery_tag, redelivered, exchange,
                                                     routing_key, message_count), props_raw, body)

    def basic_return(self, channel: int, reply_code: int, reply_text: str, exchange: str,
                     routing_key: str, props_raw: bytes, body: bytes) -> None:
        """Queue basic.return + content (a mandatory message that was not routed)."""
        self._send_content(channel, spec.Basic.Return(reply_code, reply_text, exchange,
                                                      routing_key), props_raw, body)

    def confirm(self, channel: int, delivery_tag: int, multiple: bool, ok: bool = True) -> None:
        """Queue a publisher confirm: basic.ack, or basic.nack when not ``ok``."""
        self.write((ack_frame if ok else nack_frame)(channel, delivery_tag, multiple))

    def _send_content(self, channel: int, method: spec.Method, props_raw: bytes,
                      body: bytes) -> None:
        self.write_many([method_frame(channel, method),
                         *content_parts(channel, props_raw, body, self.frame_max)],
                        len(body) + _CONTENT_OVERHEAD)

    def send_heartbeat(self) -> None:
        self.write(HEARTBEAT_FRAME)

    @property
    def has_output(self) -> bool:
        """Frames are waiting to be written (an empty body still makes frames)."""
        return bool(self._out)
