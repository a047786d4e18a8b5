"""The lean publishing listener (--hermes-port): the same answers as the management port's
route, keep-alive, and bad requests refused with one clear status."""
from __future__ import annotations

import httpx
import trio

from .test_http import make_subscription, make_topic


async def raw(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    out = b""
    with trio.fail_after(5):
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            out += chunk
    await stream.aclose()
    return out


async def test_frontend_publish(hermes_broker):
    http = hermes_broker.http
    await make_topic(http, maxMessageSize=50)
    await make_subscription(http, "shop.orders", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    port = hermes_broker.hermes.frontend.port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", auth=("guest", "guest")) as front:
        for i in range(3):  # one keep-alive connection
            r = await front.post("/topics/shop.orders", content=b'{"i": %d}' % i,
                                 headers={"Content-Type": "application/json"})
            assert r.status_code == 201 and len(r.headers["Hermes-Message-Id"]) == 36
        r = await front.post("/topics/shop.none", content=b"{}")
        assert r.status_code == 404 and r.json()["code"] == "TOPIC_NOT_FOUND"
        r = await front.post("/topics/shop.orders", content=b"x" * 51)
        assert r.status_code == 413 and r.json()["code"] == "MESSAGE_TOO_LARGE"
        assert (await front.get("/topics/shop.orders")).status_code == 405
        assert (await front.post("/elsewhere", content=b"")).status_code == 404
    assert hermes_broker.vhost.queues["shop.orders.s"].message_count == 3
    # no Content-Length, a malformed request line, a huge head: one clear status each, then close
    r = await httpx.AsyncClient().post(f"http://127.0.0.1:{port}/topics/shop.orders", content=b"{}")
    assert r.status_code == 401 and "WWW-Authenticate" in r.headers
    r = await httpx.AsyncClient(auth=("guest", "nope")).post(
        f"http://127.0.0.1:{port}/topics/shop.orders", content=b"{}")
    assert r.status_code == 401
    assert (await raw(port, b"POST /topics/shop.orders HTTP/1.1\r\nHost: x\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")).startswith(b"HTTP/1.1 411 ")
    assert (await raw(port, b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    assert (await raw(port, b"POST /topics/a.b HTTP/1.1\r\nX: " + b"y" * 20000)).startswith(
        b"HTTP/1.1 431 ")
    assert hermes_broker.vhost.queues["shop.orders.s"].message_count == 3
