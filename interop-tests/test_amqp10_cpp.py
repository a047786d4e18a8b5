"""A client in another language: Qpid Proton C++ (Debian's libqpid-proton-cpp12-dev; `make
system-deps` installs it) exchanging messages through one TrioMQ with pika (AMQP 0-9-1), paho
(MQTT) and Qpid Proton's Python client. The client (amqp10_cpp/client.cpp) is compiled into
the test's tmp dir; without a C++ compiler or Proton's headers the tests skip."""
from __future__ import annotations

import queue as queuelib
import shutil
import subprocess
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from brokerproc import BrokerProc
from proton import Message
from proton.utils import BlockingConnection

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0  # seconds a client run may take on a loaded machine (a hang guard)
SOURCE = Path(__file__).resolve().parent / "amqp10_cpp" / "client.cpp"


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++)")
    if not Path("/usr/include/proton/messaging_handler.hpp").exists():
        pytest.skip("Qpid Proton C++ headers missing (apt install libqpid-proton-cpp12-dev)")
    exe = tmp_path_factory.mktemp("cpp") / "client"
    build = subprocess.run([cxx, "-std=c++11", "-O1", "-o", str(exe), str(SOURCE),
                            "-lqpid-proton-cpp"], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return exe


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("amqp10-cpp") / "data", store="memory", mqtt=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def run(client: Path, broker: BrokerProc, *args: str) -> list[list[str]]:
    """Runs the C++ client to completion; its output lines split at tabs."""
    done = subprocess.run([str(client), args[0], f"127.0.0.1:{broker.port}", *args[1:]],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return [line.split("\t") for line in done.stdout.splitlines()]


def python_proton(broker: BrokerProc) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{broker.port}", timeout=WAIT,
                              allowed_mechs="PLAIN")


def test_cpp_to_pika_and_back(client, broker):
    name = "cpp-pika-" + uuid.uuid4().hex[:8]
    p = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = p.channel()
        ch.queue_declare(name)
        run(client, broker, "send", f"/queues/{name}", "3", "c2p")
        got = []
        for _ in range(3):
            method, props, body = ch.basic_get(name, auto_ack=True)
            assert method is not None, "a message the C++ client sent is missing"
            got.append((body, props))
        assert [b for b, _ in got] == [b"c2p-0", b"c2p-1", b"c2p-2"]
        props = got[1][1]
        assert props.delivery_mode == 2 and props.content_type == "text/plain"
        assert props.headers["lang"] in ("c++", b"c++") and props.headers["seq"] == 1
        assert props.message_id == "1"  # a ulong id, its type kept in a header
        assert props.headers["x-message-id-type"] in ("ulong", b"ulong")
        ch.basic_publish("", name, b"p2c", pika.BasicProperties(headers={"from": "pika"}))
        lines = run(client, broker, "receive", f"/queues/{name}", "1")
        assert lines == [["p2c", "", "from=pika"]]
    finally:
        p.channel().queue_delete(name)
        p.close()


def test_cpp_and_mqtt_through_amq_topic(client, broker):
    got: queuelib.Queue = queuelib.Queue()
    subscribed: queuelib.Queue = queuelib.Queue()
    m = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cpp-" + uuid.uuid4().hex[:6])
    m.on_message = lambda _c, _u, msg: got.put(msg)
    m.on_subscribe = lambda *a: subscribed.put(True)
    m.connect("127.0.0.1", broker.mqtt_port)
    m.loop_start()
    inbox = "cpp-mqtt-" + uuid.uuid4().hex[:8]
    p = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        m.subscribe("sensors/cpp", qos=1)
        subscribed.get(timeout=WAIT)
        # C++ -> MQTT: amq.topic with the MQTT topic's routing key
        run(client, broker, "send", "/exchanges/amq.topic/sensors.cpp", "2", "reading")
        assert sorted(got.get(timeout=WAIT).payload for _ in range(2)) == [b"reading-0",
                                                                          b"reading-1"]
        # MQTT -> C++: a queue bound to what the MQTT client publishes to
        p.channel().queue_declare(inbox)
        p.channel().queue_bind(inbox, "amq.topic", routing_key="commands.cpp")
        m.publish("commands/cpp", b"switch on", qos=1).wait_for_publish(timeout=WAIT)
        lines = run(client, broker, "receive", f"/queues/{inbox}", "1")
        assert [line[0] for line in lines] == ["switch on"]
    finally:
        m.loop_stop()
        m.disconnect()
        p.channel().queue_delete(inbox)
        p.close()


def test_cpp_and_python_proton(client, broker):
    name = "cpp-py-" + uuid.uuid4().hex[:8]
    c = python_proton(broker)
    try:
        c.create_sender(f"/queue/{name}").send(Message(body="from python", subject="py",
                                                       properties={"lang": "python"}))
        assert run(client, broker, "receive", f"/queue/{name}", "1") == [
            ["from python", "py", "lang=python"]]
        run(client, broker, "send", f"/queue/{name}", "2", "c2py")
        rcv = c.create_receiver(f"/queue/{name}", credit=10)
        for i in range(2):
            msg = rcv.receive(timeout=WAIT)
            assert msg.body == f"c2py-{i}"  # an amqp-value string stays one, 1.0 to 1.0
            assert msg.subject == "from-cpp" and msg.properties == {"lang": "c++", "seq": i}
            assert msg.id == i and msg.durable
            rcv.accept()
    finally:
        c.close()
        p = pika.BlockingConnection(pika.URLParameters(broker.url))
        p.channel().queue_delete(name)
        p.close()


def test_refused_transfer_is_an_error_exit(client, broker):
    """The client reports what the broker answered: a transfer to an exchange nothing is
    bound to is released (RabbitMQ 4's rule for an unroutable transfer)."""
    done = subprocess.run([str(client), "send", f"127.0.0.1:{broker.port}",
                           "/exchanges/amq.direct/nobody-" + uuid.uuid4().hex[:6], "1", "x"],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 2 and "released" in done.stderr
