"""The push sender's HTTP/1.1 client (broker/hermes/client.py) against a raw trio server that
answers in every framing a real endpoint may use; and the frontend fed random bytes."""
from __future__ import annotations

import random

import trio

from broker.hermes.client import Connection, Endpoint, PushError, Watchdog

from .endpoint import free_port


async def serve_script(nursery, answers: list[bytes], seen: list[bytes]) -> int:
    """A server that reads one request head (and Content-Length body) per answer."""
    port = free_port()

    async def handle(stream):
        buf = b""
        for answer in list(answers):
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(buf) < length:
                buf += await stream.receive_some(65536)
            seen.append(head + b"\r\n\r\n" + buf[:length])
            buf = buf[length:]
            answers.remove(answer)
            if answer == b"CLOSE":
                await stream.aclose()
                return
            await stream.send_all(answer)
        await stream.aclose()

    await nursery.start(trio.serve_tcp, handle, port)
    return port


async def test_framings_and_keep_alive(nursery):
    seen: list[bytes] = []
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nRetry-After: 2\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ]
    port = await serve_script(nursery, answers, seen)
    conn = Connection(Endpoint(f"http://u:p%40ss@127.0.0.1:{port}/hook?x=1"))
    assert (await conn.post(b"a", {"Hermes-Message-Id": "1"}, 5))[0] == 200
    assert (await conn.post(b"b", {}, 5))[0] == 201
    assert (await conn.post(b"c", {}, 5))[0] == 204
    status, headers = await conn.post(b"d", {}, 5)
    assert status == 503 and headers["retry-after"] == "2"
    assert conn._stream is None  # closed as asked
    assert seen[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Basic dTpwQHNz\r\n" in seen[0]  # u:p@ss
    assert b"Hermes-Message-Id: 1\r\n" in seen[0] and seen[0].endswith(b"\r\n\r\na")
    await conn.aclose()


async def test_stale_connection_is_retried_once_and_failures_raise(nursery):
    seen: list[bytes] = []
    port = await serve_script(nursery, [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], seen)
    conn = Connection(Endpoint(f"http://127.0.0.1:{port}/"))
    assert (await conn.post(b"1", {}, 5))[0] == 200
    await trio.sleep(0.05)  # the server closed the kept-alive connection meanwhile
    answers2 = [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
    port2 = await serve_script(nursery, answers2, seen)
    conn.endpoint.port = port2  # the retry opens a new connection (to the new server)
    assert (await conn.post(b"2", {}, 5))[0] == 200
    await conn.aclose()
    # nothing listens: PushError; an endpoint that never answers: TooSlowError
    dead = Connection(Endpoint(f"http://127.0.0.1:{free_port()}/"))
    try:
        await dead.post(b"x", {}, 5)
        raise AssertionError("no error")
    except PushError as exc:
        assert "cannot connect" in str(exc)
    silent_port = free_port()

    async def silent(stream):
        await trio.sleep_forever()

    await nursery.start(trio.serve_tcp, silent, silent_port)
    slow = Connection(Endpoint(f"http://127.0.0.1:{silent_port}/"))
    try:
        await slow.post(b"x", {}, 0.2)
        raise AssertionError("no timeout")
    except trio.TooSlowError:
        pass
    assert slow._stream is None
    # the same with a watchdog closing the overdue socket instead of a cancel scope
    async with trio.open_nursery() as inner:
        watchdog = Watchdog(0.02)
        inner.start_soon(watchdog.run)
        watched = Connection(Endpoint(f"http://127.0.0.1:{silent_port}/"), watchdog)
        with trio.fail_after(5):
            try:
                await watched.post(b"x", {}, 0.2)
                raise AssertionError("no timeout")
            except trio.TooSlowError:
                pass
        assert watched._stream is None and not watchdog.active
        answers3 = [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
        watched.endpoint.port = await serve_script(nursery, answers3, seen)
        assert (await watched.post(b"y", {}, 5))[0] == 200  # a new connection, no expiry left
        await watched.aclose()
        inner.cancel_scope.cancel()


async def test_frontend_answers_garbage_with_a_status_or_closes(hermes_broker):
    port = hermes_broker.hermes.frontend.port
    rng = random.Random(12)
    heads = [b"", b"POST /topics/a.b HTTP/1.1\r\n", b"GET / HTTP/1.0\r\n", b"POST /topics/ HTTP/1.1\r\n"]
    for _ in range(60):
        garbage = rng.choice(heads) + rng.randbytes(rng.randrange(1, 200))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(garbage + b"\r\n\r\n")
        out = b""
        with trio.move_on_after(3) as scope:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                out += data
        await stream.aclose()
        assert not scope.cancelled_caught, f"the frontend neither answered nor closed: {garbage!r}"
        assert out == b"" or out.startswith(b"HTTP/1.1 4"), (garbage, out[:80])
    assert hermes_broker.hermes.topics == {}
