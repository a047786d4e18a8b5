"""AMQP 1.0 against AMQP 0-9-1 on one TrioMQ (started here, memory store), one run:
publish N messages to a queue, then consume them, over each protocol; per phase the
client's msg/s and the broker's CPU time per message (from /proc).

AMQP 1.0: qpid-proton's event-driven client (Container), settled (at-most-once,
pre-settled transfers; the phase ends when the queue holds them all) and unsettled (each
transfer waits for the broker's accepted, within the link credit the broker grants); the
consumer accepts every message with a prefetch of 200. AMQP 0-9-1: pika, publishes without
confirms (pika's blocking confirms wait per message) and a consumer with prefetch 200 acking
each message.

The same AMQP 1.0 workloads then run against the machine's RabbitMQ (its rabbitmq_amqp1_0
plugin, v1 address /queue/Q) when it answers AMQP 1.0 on --rabbitmq-port, with its CPU
per message from /proc (the beam.smp owning the port; root, or the same user, can see it).

    python -m bench.amqp10 [--messages 20000] [--size 256] [--rabbitmq-port 5672|0]
"""
from __future__ import annotations

import argparse
import time
import uuid

import pika
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container

from .procinfo import TrioMQProcess, cpu_seconds, pid_listening_on


class _Send(MessagingHandler):
    def __init__(self, url: str, address: str, n: int, body: bytes, settled: bool):
        super().__init__()
        self.url, self.address, self.n, self.body, self.settled = url, address, n, body, settled
        self.sent = self.decided = 0

    def on_start(self, event):
        conn = event.container.connect(self.url, allowed_mechs="PLAIN",
                                       allow_insecure_mechs=True)
        event.container.create_sender(conn, self.address,
                                      options=AtMostOnce() if self.settled else None)

    def on_sendable(self, event):
        sender = event.sender
        while sender.credit and self.sent < self.n:
            sender.send(Message(body=self.body, inferred=True))
            self.sent += 1
        if self.settled and self.sent >= self.n:
            self._close_when_sent(event)

    def _close_when_sent(self, event):
        # pre-settled transfers still in the client's buffer are lost on close
        if event.sender.queued:
            event.container.schedule(0.01, _Later(lambda: self._close_when_sent(event)))
        else:
            event.connection.close()

    def _decided(self, event):
        self.decided += 1
        if self.decided >= self.n:
            event.connection.close()

    on_accepted = on_released = on_rejected = _decided


class _Later:
    def __init__(self, fn):
        self.fn = fn

    def on_timer_task(self, event):
        self.fn()


class _Receive(MessagingHandler):
    def __init__(self, url: str, address: str, n: int):
        super().__init__(prefetch=200)
        self.url, self.address, self.n = url, address, n
        self.got = 0

    def on_start(self, event):
        conn = event.container.connect(self.url, allowed_mechs="PLAIN",
                                       allow_insecure_mechs=True)
        event.container.create_receiver(conn, self.address)

    def on_message(self, event):
        self.got += 1
        if self.got >= self.n:
            event.receiver.close()
            event.connection.close()


def _measure(pid: int, fn) -> tuple[float, float]:
    c0 = cpu_seconds(pid) or 0.0
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    return elapsed, (cpu_seconds(pid) or 0.0) - c0


def run_amqp10(url: str, pid: int, n: int, size: int, settled: bool,
               consume_prefix: str = "/queues/") -> dict:
    q = "bench-amqp10-" + uuid.uuid4().hex[:8]
    body = b"x" * size
    port = int(url.rsplit(":", 1)[1])

    def publish() -> None:
        Container(_Send(url, f"/queue/{q}", n, body, settled)).run()
        if settled:
            # presettled: the client is done once its octets are written, which a broker
            # granting more credit lets it do sooner; done is when the queue has them all
            _wait_for_count(port, q, n)

    pub = _measure(pid, publish)
    con = _measure(pid, lambda: Container(_Receive(url, consume_prefix + q, n)).run())
    return {"publish": pub, "consume": con}


def _wait_for_count(port: int, queue: str, n: int, timeout: float = 300.0) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        while ch.queue_declare(queue, passive=True).method.message_count < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"{queue}: fewer than {n} messages after {timeout} s")
            time.sleep(0.005)
    finally:
        conn.close()


def _speaks_amqp10(port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(5)
            s.sendall(b"AMQP\x03\x01\x00\x00")
            return s.recv(8) == b"AMQP\x03\x01\x00\x00"
    except OSError:
        return False


def run_rabbitmq(port: int, n: int, size: int) -> dict:
    """The AMQP 1.0 workloads against RabbitMQ's plugin: 3.10 declares /queue/Q (non-durable,
    the terminus' durability) and reads it back through the same v1 address."""
    pid = pid_listening_on(port)
    if pid is None:
        raise SystemExit(f"no process found listening on {port} (its CPU cannot be read)")
    url = f"amqp://guest:guest@127.0.0.1:{port}"
    results = {}
    for settled in (True, False):
        r = run_amqp10(url, pid, n, size, settled, consume_prefix="/queue/")
        results["RabbitMQ 1.0 " + ("settled" if settled else "unsettled")] = r
    return results


def run_amqp091(port: int, pid: int, n: int, size: int) -> dict:
    q = "bench-amqp091-" + uuid.uuid4().hex[:8]
    body = b"x" * size
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(q, durable=True)

    def publish():
        for _ in range(n):
            ch.basic_publish("", q, body)
        conn.process_data_events(0)

    got = [0]

    def consume():
        ch.basic_qos(prefetch_count=200)

        def on_message(channel, method, _props, _body):
            channel.basic_ack(method.delivery_tag)
            got[0] += 1
            if got[0] >= n:
                channel.stop_consuming()
        ch.basic_consume(q, on_message)
        ch.start_consuming()

    pub = _measure(pid, publish)
    con = _measure(pid, consume)
    ch.queue_delete(q)
    conn.close()
    return {"publish": pub, "consume": con}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rabbitmq-port", type=int, default=5672,
                    help="RabbitMQ's AMQP 1.0 port to compare with (0: none)")
    args = ap.parse_args(argv)
    broker = TrioMQProcess(store="memory", extra_args=["--http-port", "0"], quiet=True)
    broker.start()
    try:
        url = f"amqp://guest:guest@127.0.0.1:{broker.port}"
        n = args.messages
        results = {
            "AMQP 1.0 settled": run_amqp10(url, broker.pid, n, args.size, True),
            "AMQP 1.0 unsettled": run_amqp10(url, broker.pid, n, args.size, False),
            "AMQP 0-9-1 (pika)": run_amqp091(broker.port, broker.pid, n, args.size),
        }
    finally:
        broker.stop()
    rabbit = {}
    if args.rabbitmq_port and _speaks_amqp10(args.rabbitmq_port):
        rabbit = run_rabbitmq(args.rabbitmq_port, n, args.size)
    elif args.rabbitmq_port:
        print(f"RabbitMQ does not answer AMQP 1.0 on {args.rabbitmq_port}: no reference figures")
    print(f"{n} messages of {args.size} bytes, TrioMQ memory store, one queue")
    print(f"{'workload':22} {'phase':8} {'msg/s':>9} {'broker CPU us/msg':>18}")
    base = results["AMQP 0-9-1 (pika)"]
    for name, phases in results.items():
        for phase, (elapsed, cpu) in phases.items():
            ratio = (cpu / base[phase][1]) if base[phase][1] else float("nan")
            print(f"{name:22} {phase:8} {n / elapsed:9.0f} {cpu / n * 1e6:18.1f}"
                  f"   (CPU x{ratio:.2f} of 0-9-1)")
    for name, phases in rabbit.items():
        ours = results["AMQP 1.0 " + name.rsplit(" ", 1)[1]]
        for phase, (elapsed, cpu) in phases.items():
            rate_ratio = elapsed / ours[phase][0]
            print(f"{name:22} {phase:8} {n / elapsed:9.0f} {cpu / n * 1e6:18.1f}"
                  f"   (TrioMQ's rate x{rate_ratio:.2f} of RabbitMQ's)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
