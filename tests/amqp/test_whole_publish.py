"""The one-step path for a basic.publish read together with its header and single body
frame (``ServerConnection._whole_publish``) must be invisible: for any mix of publishes --
well formed or not, on open, unknown or closing channels, interleaved, empty, over the
size limit -- the events and the bytes written are exactly those of the frame-by-frame
path, which is what the connection takes when the same bytes arrive one octet at a time."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.amqp.events import ContentReceived

from .sansio_helpers import (
    body_frame,
    header_frame,
    mframe,
    open_connection,
    publish,
    raw_frame,
)


def _run(data: bytes, bytewise: bool):
    conn = open_connection(channels=(1, 2), max_message_size=100)
    events = []
    if bytewise:
        for i in range(len(data)):
            events += conn.receive_data(data[i:i + 1])
    else:
        events += conn.receive_data(data)
    return events, conn.data_to_send(), conn.state


_publish_args = struct.pack(">HHH", 60, 40, 0)

pieces = st.one_of(
    st.builds(lambda ch, body, props: publish(ch, body, props=props),
              st.sampled_from([1, 2, 3]), st.binary(max_size=120),
              st.sampled_from([None, {"delivery_mode": 2}, {"headers": {"a": 1}, "priority": 3},
                               {"expiration": "100"}])),
    st.builds(lambda ch, n: publish(ch, b"x" * n), st.sampled_from([1, 2]),
              st.integers(99, 102)),  # around max_message_size
    st.builds(lambda ch, body: publish(ch, body, chunks=2), st.sampled_from([1, 2]),
              st.binary(min_size=2, max_size=40)),
    # a header of another class, or a body longer / shorter than declared
    st.builds(lambda ch, n: mframe(ch, spec.Basic.Publish(0, "", "k", False, False))
              + header_frame(ch, n, class_id=50) + body_frame(ch, b"x" * n),
              st.sampled_from([1, 2]), st.integers(1, 5)),
    st.builds(lambda ch, n, m: mframe(ch, spec.Basic.Publish(0, "", "k", False, False))
              + header_frame(ch, n) + body_frame(ch, b"y" * m),
              st.sampled_from([1, 2]), st.integers(1, 5), st.integers(1, 5)),
    # malformed publish arguments and properties
    st.builds(lambda ch: raw_frame(spec.FRAME_METHOD, ch, _publish_args + b"\x09ab")
              + header_frame(ch, 1) + body_frame(ch, b"z"), st.sampled_from([1, 2])),
    st.builds(lambda ch: mframe(ch, spec.Basic.Publish(0, "", "k", False, False))
              + raw_frame(spec.FRAME_HEADER, ch, struct.pack(">HHQ", 60, 0, 1) + b"\x80\x00\x05ab")
              + body_frame(ch, b"z"), st.sampled_from([1, 2])),
    # channel close in between, a heartbeat, a second channel's publish in the middle
    st.builds(lambda ch: mframe(ch, spec.Channel.Close(200, "bye", 0, 0)), st.sampled_from([1, 2])),
    st.just(raw_frame(spec.FRAME_HEARTBEAT, 0, b"")),
    st.builds(lambda: mframe(1, spec.Basic.Publish(0, "", "k", False, False))
              + mframe(2, spec.Basic.Publish(0, "", "k", False, False)) + header_frame(1, 1)
              + body_frame(1, b"q")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(pieces, max_size=8))
def test_same_events_and_output_as_frame_by_frame(parts):
    data = b"".join(parts)
    whole = _run(data, bytewise=False)
    framewise = _run(data, bytewise=True)
    assert whole == framewise


def test_whole_publishes_in_one_read_become_contents():
    data = b"".join(publish(1, b"m%d" % i, routing_key="rk", props={"delivery_mode": 2})
                    for i in range(50))
    events, out, _ = _run(data, bytewise=False)
    assert [type(e) for e in events] == [ContentReceived] * 50
    assert [e.body for e in events] == [b"m%d" % i for i in range(50)]
    assert all(e.properties == {"delivery_mode": 2} and e.routing_key == "rk" for e in events)
    assert out == b""
