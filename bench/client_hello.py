"""What AMQP 0-9-1 clients send when they connect: a stand-in server on a free port that
offers RabbitMQ's ``connection.start`` (its capabilities, PLAIN and AMQPLAIN) and
``connection.tune`` (channel_max 2047, frame_max 131072, heartbeat 60, RabbitMQ's
defaults), records the client's ``start-ok`` (product, version, capabilities) and
``tune-ok`` (channel_max, frame_max, heartbeat it settles on), then drops the connection.

    .venv/bin/python -m bench.client_hello

Probes the clients installed here: pika, aio-pika, kombu (py-amqp), amqp-tools
(rabbitmq-c) and the Java client (if /usr/share/java/amqp-client.jar is there); prints one
markdown row each (docs/clients.md). A client that retries on the dropped connection is
stopped after its first handshake.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

from broker.amqp import spec
from broker.amqp.codec import method_frame

SERVER_CAPS = {"publisher_confirms": True, "exchange_exchange_bindings": True,
               "basic.nack": True, "consumer_cancel_notify": True, "connection.blocked": True,
               "consumer_priorities": True, "authentication_failure_close": True,
               "per_consumer_qos": True, "direct_reply_to": True}


def _read_method(sock: socket.socket, buf: bytearray):
    while True:
        if len(buf) >= 7:
            _t, _ch, size = struct.unpack_from(">BHI", buf, 0)
            if len(buf) >= 8 + size:
                payload = bytes(buf[7:7 + size])
                del buf[:8 + size]
                if _t == 1:
                    return spec.decode_method(payload)
                continue
        data = sock.recv(65536)
        if not data:
            raise EOFError
        buf += data


def serve_once(listener: socket.socket, out: dict) -> None:
    conn, _ = listener.accept()
    conn.settimeout(20)
    try:
        header = conn.recv(8)
        out["header"] = header
        conn.sendall(method_frame(0, spec.Connection.Start(
            version_major=0, version_minor=9,
            server_properties={"product": "RabbitMQ", "version": "3.10.8",
                               "capabilities": SERVER_CAPS},
            mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US")))
        buf = bytearray()
        start_ok = _read_method(conn, buf)
        props = start_ok.client_properties
        out["product"] = _s(props.get("product"))
        out["version"] = _s(props.get("version"))
        out["capabilities"] = sorted(k for k, v in (props.get("capabilities") or {}).items() if v)
        conn.sendall(method_frame(0, spec.Connection.Tune(channel_max=2047, frame_max=131072,
                                                          heartbeat=60)))
        tune_ok = _read_method(conn, buf)
        out["tune_ok"] = (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat)
    except (OSError, EOFError) as exc:
        out["error"] = repr(exc)
    finally:
        conn.close()


def _s(v) -> str:
    if v is None:
        return "(none)"
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def probe(name: str, run) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    out: dict = {"client": name}
    t = threading.Thread(target=serve_once, args=(listener, out), daemon=True)
    t.start()
    try:
        run(port)
    except Exception as exc:  # the dropped connection: expected
        out.setdefault("client_error", type(exc).__name__)
    t.join(30)
    listener.close()
    return out


def run_pika(port):
    import pika
    pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port,
                                                      connection_attempts=1, socket_timeout=5))


def run_aio_pika(port):
    import aio_pika

    async def go():
        await asyncio.wait_for(aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/"), 10)
    asyncio.run(go())


def run_kombu(port):
    import kombu
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{port}//", connect_timeout=5) as c:
        c.connect()


def run_amqp_tools(port):
    if shutil.which("amqp-publish") is None:
        raise RuntimeError("amqp-tools not installed")
    subprocess.run(["amqp-publish", "--url", f"amqp://guest:guest@127.0.0.1:{port}",
                    "-r", "q", "-b", "x"], capture_output=True, timeout=20)


JAVA = """
import com.rabbitmq.client.*;
public class Hello { public static void main(String[] a) throws Exception {
  ConnectionFactory f = new ConnectionFactory(); f.setHost("127.0.0.1");
  f.setPort(Integer.parseInt(a[0])); f.setConnectionTimeout(5000);
  try { f.newConnection(); } catch (Exception e) { } } }
"""


def run_java(port):
    jar = "/usr/share/java/amqp-client.jar"
    if not (shutil.which("java") and os.path.exists(jar)):
        raise RuntimeError("Java client not installed")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "Hello.java")
        with open(src, "w") as f:
            f.write(JAVA)
        cp = ":".join([jar] + [p for p in ("/usr/share/java/slf4j-api.jar",
                                           "/usr/share/java/slf4j-nop.jar") if os.path.exists(p)])
        subprocess.run(["java", "-cp", cp, src, str(port)], capture_output=True, timeout=60)


def main() -> None:
    print("| client | product, version | capabilities | tune-ok (channel_max, frame_max, "
          "heartbeat) to RabbitMQ's (2047, 131072, 60) |\n|---|---|---|---|")
    for name, run in (("pika", run_pika), ("aio-pika", run_aio_pika),
                      ("kombu/py-amqp", run_kombu), ("amqp-tools", run_amqp_tools),
                      ("Java client", run_java)):
        r = probe(name, run)
        if "tune_ok" not in r:
            print(f"| {name} | not probed ({r.get('client_error') or r.get('error')}) | | |")
            continue
        print(f"| {name} | {r['product']} {r['version']} | {', '.join(r['capabilities'])} "
              f"| {r['tune_ok']} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
