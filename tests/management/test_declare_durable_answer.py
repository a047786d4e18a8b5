"""PUT /api/queues (durable), PUT /api/exchanges (durable) and POST /api/bindings answer
201/204 once the store has made the new definition durable, as a queue.declare-ok
(docs/durability.md): a kill -9 right after the answer must not lose it."""
from __future__ import annotations

import httpx
import pytest
import trio

from ..durable_answers import HeldDisk, SlowDiskBroker, journal_broker


async def test_answers_wait_for_the_definitions_write(tmp_path, nursery):
    broker, server, store, _ = await journal_broker(nursery, tmp_path, http_port=0,
                                                    http_host="127.0.0.1")
    disk = HeldDisk(store)
    try:
        with trio.fail_after(10):
            await broker.http_server.started.wait()
        url = f"http://127.0.0.1:{broker.http_server.port}"
        async with httpx.AsyncClient(base_url=url, auth=("guest", "guest"), timeout=30) as api:
            # nothing stored, nothing to wait for
            r = await api.put("/api/queues/%2F/tq", json={"durable": False})
            assert r.status_code == 201
            answers: dict[str, int] = {}

            async def put(name: str, path: str, body: dict, post: bool = False) -> None:
                r = await (api.post if post else api.put)(path, json=body)
                answers[name] = r.status_code

            async with trio.open_nursery() as requests:
                requests.start_soon(put, "queue", "/api/queues/%2F/dq", {"durable": True})
                requests.start_soon(put, "exchange", "/api/exchanges/%2F/dx",
                                    {"type": "direct", "durable": True})
                with trio.move_on_after(0.5):
                    while not answers:  # noqa: ASYNC110 - a negative: nothing comes
                        await trio.sleep(0.02)
                assert answers == {}, "answered before the definition was durable"
                disk.release()
            assert answers == {"queue": 201, "exchange": 201}
            assert (await api.post("/api/bindings/%2F/e/dx/q/dq",
                                   json={"routing_key": "k"})).status_code == 201
    finally:
        disk.release()
        await server.shutdown()


async def test_a_binding_waits_for_its_write(tmp_path, nursery):
    broker, server, store, _ = await journal_broker(nursery, tmp_path, http_port=0,
                                                    http_host="127.0.0.1")
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("dx", "direct", durable=True)
    vhost.declare_queue("dq", durable=True)
    disk = HeldDisk(store)
    try:
        with trio.fail_after(10):
            await broker.http_server.started.wait()
        url = f"http://127.0.0.1:{broker.http_server.port}"
        async with httpx.AsyncClient(base_url=url, auth=("guest", "guest"), timeout=30) as api:
            answers: list[int] = []

            async def bind() -> None:
                r = await api.post("/api/bindings/%2F/e/dx/q/dq", json={"routing_key": "k"})
                answers.append(r.status_code)

            async with trio.open_nursery() as requests:
                requests.start_soon(bind)
                with trio.move_on_after(0.5):
                    while not answers:  # noqa: ASYNC110 - a negative: nothing comes
                        await trio.sleep(0.02)
                assert answers == [], "answered before the binding was durable"
                disk.release()
            assert answers == [201]
    finally:
        disk.release()
        await server.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_right_after_the_201_keeps_the_queue(tmp_path):
    """A real broker process whose journal writes are slow: PUT /api/queues answers 201,
    then kill -9 at once; the queue is there after the restart."""
    b = SlowDiskBroker(tmp_path / "data")
    b.start()
    try:
        b.slow_disk(True)
        r = httpx.put(f"http://127.0.0.1:{b.http_port}/api/queues/%2F/survivor",
                      json={"durable": True}, auth=("guest", "guest"), timeout=60)
        assert r.status_code == 201
        b.crash_and_restart()
        assert b.queue_exists("survivor")
    finally:
        b.stop()
