"""Stream-protocol publishes in the audit trail, as AMQP ones: a real broker process,
the rstream client, the Avro files read back."""
from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time

import pytest
from rstream import AMQPMessage, Producer, Properties

from broker.audit.reader import FileReader
from broker.audit.writer import node_files

ROOT = __file__.rsplit("/tests/", 1)[0]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(p, port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.timeout(120)
def test_stream_protocol_publishes_in_the_trail(tmp_path):
    port, stream_port = _port(), _port()
    log = open(tmp_path / "broker.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(port),
         "--stream-port", str(stream_port), "--http-port", "0", "--mqtt-port", "0",
         "--data-dir", str(tmp_path / "data"), "--audit-dir", str(tmp_path / "trail"),
         "--audit-node", "mq"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_port(proc, stream_port)

        async def publish() -> None:
            async with Producer("127.0.0.1", port=stream_port, username="guest",
                                password="guest") as p:
                await p.create_stream("trail-s")
                await p.send_wait("trail-s", AMQPMessage(
                    body=b"hello", properties=Properties(message_id="m-1",
                                                         correlation_id="c-1"),
                    application_properties={"x-producer": "shop", "x-seq": 7}))
                confirmed: list = []
                await p.send_sub_entry("trail-s", [AMQPMessage(body=b"b%d" % i)
                                                   for i in range(3)],
                                       on_publish_confirm=lambda s: confirmed.append(s))
                for _ in range(600):
                    if confirmed:
                        break
                    await asyncio.sleep(0.05)
                assert confirmed and all(c.is_confirmed for c in confirmed)

        asyncio.run(publish())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
    records = sorted((r for f in node_files(str(tmp_path / "trail"), "mq")
                      for r in FileReader(f)), key=lambda r: r["seq"])
    pubs = [r for r in records if r["event"] == "published"]
    assert [(r["vhost"], r["user"], r["exchange"], r["routing_key"], r["queues"],
             r["outcome"], r["persistent"]) for r in pubs] == \
        [("/", "guest", "", "trail-s", ["trail-s"], "routed", True)] * 4
    first = pubs[0]
    assert (first["message_id"], first["correlation_id"], first["producer"],
            first["producer_seq"], first["body_size"]) == ("m-1", "c-1", "shop", 7, 5)
    assert [r["body_size"] for r in pubs[1:]] == [2, 2, 2]
    # the publishing ids: the single message's, then the batch's (one id for all three)
    assert pubs[0]["confirm_seq"] < pubs[1]["confirm_seq"] == pubs[3]["confirm_seq"]
    assert len({r["msg"] for r in pubs}) == 4
    assert all(r["connection"] for r in pubs)
