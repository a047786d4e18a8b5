"""The WebSocket transport of MQTT (broker/listeners/mqtt_ws.py) on trio's in-memory streams:
the upgrade's refusals, and the byte stream MQTT reads being the binary frames' payloads
whatever the frame and read boundaries (fragmented messages, pings in between, any split
of the bytes across reads), with what the broker writes leaving as binary frames."""
from __future__ import annotations

import os
import struct

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Pong,
    RejectConnection,
    Request,
)

from broker.listeners.mqtt_ws import handshake


def frame(opcode: int, payload: bytes, fin=True) -> bytes:
    n = len(payload)
    head = bytes(((0x80 if fin else 0) | opcode,))
    if n < 126:
        head += bytes((0x80 | n,))
    elif n < 65536:
        head += bytes((0x80 | 126,)) + struct.pack(">H", n)
    else:
        head += bytes((0x80 | 127,)) + struct.pack(">Q", n)
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def _upgrade(target="/ws", protocols=("mqtt",)):
    """(server's WebSocketStream or None, client's wsproto, client stream, answer events,
    answer bytes)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    client = WSConnection(ConnectionType.CLIENT)
    await client_stream.send_all(client.send(
        Request(host="127.0.0.1", target=target, subprotocols=list(protocols))))
    ws = await handshake(server_stream, "test")
    answer = await client_stream.receive_some(65536)
    client.receive_data(answer)
    return ws, client, client_stream, list(client.events()), answer


@pytest.mark.parametrize(("target", "protocols", "status"), [
    ("/ws", ("mqtt",), 101),
    ("/ws?x=1", ("v12.stomp", "mqtt"), 101),
    ("/ws", ("mqttv3.1",), 101),
    ("/mqtt", ("mqtt",), 404),
    ("/ws", (), 400),
    ("/ws", ("stomp",), 400),
])
async def test_upgrade_statuses(target, protocols, status):
    ws, client, _, events, answer = await _upgrade(target, protocols)
    assert (ws is not None) == (status == 101)
    if status == 101:
        assert isinstance(events[0], AcceptConnection)
        assert events[0].subprotocol == protocols[-1]
    else:
        assert answer.split()[1] == str(status).encode()
        assert b"connection: close" in answer.lower()


async def test_not_an_upgrade_is_400_and_other_versions_426():
    async def status(request: bytes) -> bytes:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        await client_stream.send_all(request)
        assert await handshake(server_stream, "test") is None
        return (await client_stream.receive_some(65536)).split()[1]

    assert await status(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n") == b"400"
    assert await status(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00\r\n\r\n") == b"400"
    assert await status(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n"
        b"Sec-WebSocket-Protocol: mqtt\r\n\r\n") == b"426"


messages = st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(messages=messages, fragments=st.lists(st.integers(1, 4), min_size=8, max_size=8),
       pings=st.lists(st.booleans(), min_size=8, max_size=8), data=st.data())
async def test_payload_stream_whatever_the_boundaries(messages, fragments, pings, data):
    """Binary messages cut into fragments (with pings between them), the whole byte stream
    cut at random points across writes: the reader gets exactly the payloads, in order, and
    a pong for each ping."""
    wire = b""
    for i, payload in enumerate(messages):
        n = min(fragments[i], max(1, len(payload)))
        cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), min_size=n - 1,
                                         max_size=n - 1)))
        parts = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
        for j, part in enumerate(parts):
            wire += frame(0x2 if j == 0 else 0x0, part, fin=j == len(parts) - 1)
            if pings[i] and j == 0:
                wire += frame(0x9, b"p%d" % i)
    splits = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(wire) - 1)),
                                           max_size=20))))
    chunks = [wire[a:b] for a, b in zip([0, *splits], [*splits, len(wire)], strict=True)]
    expected = b"".join(messages)

    ws, client, client_stream, _, _ = await _upgrade()
    assert ws is not None
    got = b""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async def writer():
                for c in chunks:
                    await client_stream.send_all(c)
                await client_stream.send_all(frame(0x8, struct.pack(">H", 1000)))
            nursery.start_soon(writer)
            while True:
                data_ = await ws.receive_some(65536)
                if not data_:
                    break
                got += data_
    assert got == expected
    with trio.fail_after(10):
        client.receive_data(await client_stream.receive_some(65536))
    events = list(client.events())
    assert [e.payload for e in events if isinstance(e, Pong)] == [
        b"p%d" % i for i in range(len(messages)) if pings[i]]
    assert isinstance(events[-1], CloseConnection) and events[-1].code == 1000


async def test_writes_leave_as_binary_frames_and_close_sends_1000():
    ws, client, client_stream, _, _ = await _upgrade()
    await ws.send_all(b"\x20\x02\x00\x00")
    await ws.send_all(b"x" * 70000)
    await ws.aclose()
    raw = b""
    while True:
        chunk = await client_stream.receive_some(1 << 20)
        if not chunk:
            break
        raw += chunk
    client.receive_data(raw)
    events = list(client.events())
    assert [bytes(e.data) for e in events if isinstance(e, BytesMessage)] == [
        b"\x20\x02\x00\x00", b"x" * 70000]
    assert isinstance(events[-1], CloseConnection) and events[-1].code == 1000


@pytest.mark.parametrize(("bad", "code"), [
    (frame(0x1, b"text"), 1003),
    (bytes((0x82, 3)) + b"abc", 1002),  # unmasked
    (frame(0x9, b"p" * 126), 1002),  # a control frame over 125 bytes
    (frame(0x9, b"p", fin=False), 1002),  # a fragmented control frame
], ids=["text", "unmasked", "long-control", "fragmented-control"])  # ids: the masks are random
async def test_bad_frames_close_with_a_code(bad, code):
    ws, client, client_stream, _, _ = await _upgrade()
    await client_stream.send_all(frame(0x2, b"ok") + bad)
    assert await ws.receive_some(100) == b"ok"
    assert await ws.receive_some(100) == b""
    client.receive_data(await client_stream.receive_some(65536))
    closes = [e for e in client.events() if isinstance(e, CloseConnection)]
    assert closes and closes[0].code == code


async def test_rejection_event_is_reported():
    _, _, _, events, _ = await _upgrade("/nope")
    assert isinstance(events[0], RejectConnection) and events[0].status_code == 404


async def test_empty_frames_are_not_the_end_of_the_stream():
    """A binary frame (or fragment) without payload is legal: the reader goes on to what
    follows instead of taking it for EOF (which would end the MQTT connection)."""
    ws, client, client_stream, _, _ = await _upgrade()
    # the empty frames alone in the server's read, the next one once it waits for more
    await client_stream.send_all(frame(0x2, b"") + frame(0x2, b"", fin=False)
                                 + frame(0x0, b""))
    got = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async def read():
                got.append(await ws.receive_some(100))
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await client_stream.send_all(frame(0x2, b"after"))
    assert got == [b"after"]
