"""The cluster link's reader: a content the peer declares larger than any node sends ends the
link at its header, before any of its body is held."""
from __future__ import annotations

from collections import deque

import pytest
import trio

from broker.amqp import spec
from broker.amqp.codec import FRAME_HEADER, FRAME_METHOD, FrameReader, method_frame
from broker.cluster.link import _MAX_CONTENT, Link, LinkClosed

from ..amqp.sansio_helpers import header_frame


class _Silent:
    async def receive_some(self, n: int) -> bytes:
        await trio.sleep_forever()
        return b""


async def test_a_content_declared_larger_than_any_node_sends_ends_the_link():
    link = Link("peer", "127.0.0.1:1", "/", "pw", on_pressure=lambda pressure: None)
    deliver = method_frame(1, spec.Basic.Deliver("c", 1, False, "", "q"))[7:-1]
    header = header_frame(1, _MAX_CONTENT + 1)[7:-1]
    frames = deque([(FRAME_METHOD, 1, deliver), (FRAME_HEADER, 1, header)])
    with trio.fail_after(5), pytest.raises(LinkClosed, match="declared a content of"):
        await link._reader(_Silent(), FrameReader(), frames)
