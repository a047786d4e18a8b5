"""Hostile HTTP request bodies over raw sockets: a huge declared Content-Length, a chunked
body without end, many bodies at once. Each is answered (413 naming the limit, 503 past the
bodies-in-flight budget) after a bounded number of bytes, on the management port, Hermes'
routes there and the Hermes frontend."""
from __future__ import annotations

import base64

import trio

from broker.management import http as mhttp

from .conftest import start_http_broker

AUTH = b"authorization: Basic " + base64.b64encode(b"guest:guest") + b"\r\n"
CHUNK = 16 * 1024


def _head(method: str, path: str, *headers: bytes) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nhost: x\r\n".encode() + AUTH + b"".join(headers)
            + b"content-type: application/json\r\n\r\n")


async def _answer(stream, deadline: float = 10) -> bytes:
    data = b""
    with trio.fail_after(deadline):
        while b"\r\n\r\n" not in data:
            more = await stream.receive_some(65536)
            if not more:
                break
            data += more
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            more = await stream.receive_some(65536)
            if not more:
                break
            rest += more
    return head + b"\r\n\r\n" + rest


async def _endless(port: int, head: bytes, piece: bytes, limit: int) -> tuple[bytes, int]:
    """Send ``head`` then ``piece`` over and over until an answer comes (or ``limit``
    bytes went out): (answer, body bytes sent)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    sent = 0
    answer = b""
    async with trio.open_nursery() as nursery:
        async def reader():
            nonlocal answer
            try:
                answer = await _answer(stream, 30)
            finally:
                nursery.cancel_scope.cancel()

        nursery.start_soon(reader)
        await stream.send_all(head)
        try:
            while sent < limit:
                await stream.send_all(piece)
                sent += len(piece)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await trio.sleep_forever()  # until the reader has the answer
    await stream.aclose()
    return answer, sent


async def _until(condition, deadline: float = 10) -> None:
    with trio.fail_after(deadline):
        while not condition():  # noqa: ASYNC110 - polling the broker's counter
            await trio.sleep(0.01)


CHUNKED = (f"{CHUNK:x}\r\n".encode() + b" " * CHUNK + b"\r\n")


async def test_declared_and_endless_bodies_are_cut_at_the_limit(nursery, tmp_path):
    max_body = 256 * 1024
    hb = await start_http_broker(nursery, tmp_path, http_max_body=max_body, hermes_port=0)
    async with hb.client() as api:
        assert (await api.post("/topics", json={"name": "g.t", "maxMessageSize": 100_000})
                ).status_code == 201
    with trio.fail_after(10):
        await hb.broker.hermes.frontend.started.wait()
    huge = b"content-length: 1000000000000\r\n"
    # a huge declared length: answered from the head, before any body byte
    for port, path, expect in ((hb.http_port, "/api/queues/%2F/q", b"larger than 262144 bytes"),
                               (hb.http_port, "/topics/g.t", b"larger than 262144 bytes"),
                               (hb.broker.hermes.frontend.port, "/topics/g.t",
                                b"maximum 100000 bytes")):
        method = "PUT" if path.startswith("/api") else "POST"
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_head(method, path, huge))
        answer = await _answer(stream)
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 413") and expect in answer, answer[:300]
    # a chunked body without end: 413 once the limit is passed, the bytes sent bounded by
    # the limit plus what the sockets' buffers hold
    slack = 8 * 1024 * 1024
    answer, sent = await _endless(hb.http_port, _head("PUT", "/api/queues/%2F/q",
                                                      b"transfer-encoding: chunked\r\n"),
                                  CHUNKED, max_body + slack)
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than 262144 bytes" in answer, answer
    assert sent < max_body + slack
    # Hermes publishing on the management port: the topic's own limit comes first
    answer, sent = await _endless(hb.http_port, _head("POST", "/topics/g.t",
                                                      b"transfer-encoding: chunked\r\n"),
                                  CHUNKED, max_body + slack)
    assert answer.startswith(b"HTTP/1.1 413") and b"100000 bytes" in answer, answer
    # the frontend takes no chunked bodies at all
    stream = await trio.open_tcp_stream("127.0.0.1", hb.broker.hermes.frontend.port)
    await stream.send_all(_head("POST", "/topics/g.t", b"transfer-encoding: chunked\r\n"))
    answer = await _answer(stream)
    await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 411"), answer
    async with hb.client() as api:  # and the broker serves on
        assert (await api.put("/api/queues/%2F/q", json={})).status_code == 201
    await hb.server.shutdown()


async def test_bodies_in_flight_are_capped(nursery, tmp_path, monkeypatch):
    monkeypatch.setattr(mhttp, "BODIES_IN_FLIGHT_MIN", 0)
    max_body = 200 * 1024  # so at most 800 KiB of bodies (beyond 64 KiB each) at once
    hb = await start_http_broker(nursery, tmp_path, http_max_body=max_body, hermes_port=0)
    bodies = hb.broker.http_server.bodies
    assert bodies.limit == 4 * max_body
    async with hb.client() as api:
        assert (await api.post("/topics", json={"name": "g.t", "maxMessageSize": max_body})
                ).status_code == 201
    with trio.fail_after(10):
        await hb.broker.hermes.frontend.started.wait()
    part = 190 * 1024
    counted = part - mhttp.UNCOUNTED
    body = b"{}" + b" " * (max_body - 10)
    head = f"content-length: {len(body)}\r\n".encode()
    held = []
    for i in range(6):  # six requests, each stalled after 190 KiB of its body
        stream = await trio.open_tcp_stream("127.0.0.1", hb.http_port)
        await stream.send_all(_head("PUT", f"/api/queues/%2F/held{i}", head) + body[:part])
        held.append(stream)
    await _until(lambda: bodies.held >= 6 * counted)
    # small requests still go through meanwhile
    async with hb.client() as api:
        assert (await api.put("/api/queues/%2F/small", json={})).status_code == 201
    # a big publish on the Hermes frontend counts against the same budget
    stream = await trio.open_tcp_stream("127.0.0.1", hb.broker.hermes.frontend.port)
    await stream.send_all(_head("POST", "/topics/g.t", head) + body[:part])
    answer = await _answer(stream)
    await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 503") and b"exceed 819200 bytes" in answer, answer
    await _until(lambda: bodies.held <= 6 * counted)
    # a seventh big body passes the budget: 503, retry later
    stream = await trio.open_tcp_stream("127.0.0.1", hb.http_port)
    await stream.send_all(_head("PUT", "/api/queues/%2F/seventh", head) + body[:part])
    answer = await _answer(stream)
    await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 503") and b"exceed 819200 bytes" in answer, answer
    await _until(lambda: bodies.held <= 6 * counted)  # the refused one gave its share back
    # the held ones finish normally and give their share back
    for stream in held:
        await stream.send_all(body[part:])
        answer = await _answer(stream)
        assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
        await stream.aclose()
    await _until(lambda: bodies.held == 0)
    async with hb.client() as api:
        assert (await api.put("/api/queues/%2F/seventh", content=body)).status_code == 201
    await hb.server.shutdown()
