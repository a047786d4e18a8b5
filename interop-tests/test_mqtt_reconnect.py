"""A device that sends DISCONNECT and reconnects at once with the same client id, and many
connections taking one client id over from each other at the same time: every CONNECT gets
its CONNACK, as on Mosquitto (run against the machine's Mosquitto too when it listens)."""
from __future__ import annotations

import socket
import threading
import uuid

import pytest
from brokerproc import BrokerProc

from broker.mqtt import codec as m

pytestmark = pytest.mark.timeout(300)

MOSQUITTO = ("127.0.0.1", 1883)


def _listening(addr) -> bool:
    try:
        socket.create_connection(addr, timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def triomq(tmp_path_factory, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = BrokerProc(tmp_path_factory.mktemp("mqtt-reconnect") / "data", mqtt=True)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(params=["triomq", "mosquitto"])
def target(request):
    if request.param == "mosquitto":
        if not _listening(MOSQUITTO):
            pytest.skip("no Mosquitto on 127.0.0.1:1883")
        return MOSQUITTO, None
    proc = request.getfixturevalue("triomq")
    return ("127.0.0.1", proc.mqtt_port), proc


def connect(addr, cid: str, clean: bool) -> socket.socket:
    """A raw connection that has its CONNACK (accepted), or an AssertionError."""
    s = socket.create_connection(addr, timeout=10)
    s.sendall(m.encode(m.Connect(cid, clean, 60)))
    reader = m.PacketReader()
    got: list = []
    while not got:
        try:
            data = s.recv(4096)
        except OSError as exc:
            raise AssertionError(f"no CONNACK for {cid!r}: {exc}") from None
        if not data:
            raise AssertionError(f"closed without a CONNACK for {cid!r}")
        got += reader.feed(data)
    assert isinstance(got[0], m.ConnAck) and got[0].return_code == m.ACCEPTED, got
    return s


def _no_crash_logged(proc) -> None:
    if proc is not None:
        log = proc.log_path.read_text(errors="replace")
        assert "Traceback" not in log and "Nursery is closed" not in log, log[-3000:]


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "persistent"])
def test_disconnect_and_reconnect_at_once(target, clean):
    addr, proc = target
    cid = "rc-" + uuid.uuid4().hex[:10]
    s = connect(addr, cid, clean)
    for _ in range(1000):
        s.sendall(m.encode(m.Bare(m.DISCONNECT)))
        nxt = connect(addr, cid, clean)  # right behind the DISCONNECT, before it is closed
        s.close()
        s = nxt
    s.sendall(m.encode(m.Bare(m.DISCONNECT)))
    s.close()
    _no_crash_logged(proc)


def test_concurrent_takeovers_each_get_a_connack(target):
    addr, proc = target
    cid = "tk-" + uuid.uuid4().hex[:10]
    failures: list = []

    def worker() -> None:
        try:
            for i in range(60):
                s = connect(addr, cid, i % 2 == 0)
                if i % 3 == 0:
                    s.sendall(m.encode(m.Bare(m.DISCONNECT)))
                s.close()
        except AssertionError as exc:
            failures.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:5]
    # the client id still works: subscribe, publish to itself, receive
    s = connect(addr, cid, True)
    s.sendall(m.encode(m.Subscribe(1, [(f"{cid}/t", 0)])))
    s.sendall(m.encode(m.Publish(f"{cid}/t", b"alive", 0, False, False, None)))
    reader, got = m.PacketReader(), []
    s.settimeout(10)
    while not any(isinstance(p, m.Publish) for p in got):
        data = s.recv(4096)
        assert data, "closed"
        got += reader.feed(data)
    assert [p.payload for p in got if isinstance(p, m.Publish)] == [b"alive"]
    s.close()
    _no_crash_logged(proc)
