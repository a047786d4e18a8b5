"""A pika consumer run as a separate process by test_abrupt_disconnect.py.

    python consumer_proc.py AMQP_URL SPEC_JSON

SPEC_JSON: {"channels": [CHANNEL, ...], "end": "hang" | "shutdown"}
CHANNEL:   {"queue": name, "mode": "consume" | "get", "count": n, "prefetch": n,
            "exclusive_consumer": bool, "declare": null | {queue_declare kwargs}}

Each channel is opened on one connection; with "declare" the queue is declared first on
that channel (e.g. an exclusive queue owned by this connection).  "consume" does
basic.qos(prefetch) and basic.consume(auto_ack=False) and waits for ``count`` deliveries;
"get" does ``count`` basic.get(auto_ack=False) (retrying until each returns a message).
Nothing is ever acknowledged.  Then one line is printed and flushed:

    READY {"received": [[[body, redelivered], ...] per channel]}

and the process ends its connection without telling the broker:
  hang      - sleeps until it is killed (the test sends SIGKILL);
  shutdown  - once a line arrives on stdin: socket.shutdown(SHUT_RDWR) + close() on the
              connection's socket from inside this process (no connection.close), prints
              "SHUT", then sleeps until it is killed.
"""
from __future__ import annotations

import gc
import json
import socket
import sys
import time

import pika


def _connection_socket(conn: pika.BlockingConnection) -> socket.socket:
    try:
        return conn._impl._transport._sock
    except AttributeError:  # pika internals changed: find the one connected TCP socket
        for obj in gc.get_objects():
            if isinstance(obj, socket.socket) and obj.fileno() >= 0:
                try:
                    obj.getpeername()
                except OSError:
                    continue
                return obj
        raise


def main() -> None:
    url, spec = sys.argv[1], json.loads(sys.argv[2])
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 10
    conn = pika.BlockingConnection(params)
    received: list[list] = []
    for c in spec["channels"]:
        ch = conn.channel()
        got: list = []
        received.append(got)
        if c.get("declare") is not None:
            ch.queue_declare(c["queue"], **c["declare"])
        if c["mode"] == "consume":
            ch.basic_qos(prefetch_count=c.get("prefetch", c["count"]))
            ch.basic_consume(c["queue"],
                             lambda _c, m, _p, b, got=got: got.append([b.decode(), m.redelivered]),
                             auto_ack=False, exclusive=c.get("exclusive_consumer", False))
        else:
            deadline = time.monotonic() + 10
            while len(got) < c["count"]:
                m, _p, b = ch.basic_get(c["queue"], auto_ack=False)
                if m is not None:
                    got.append([b.decode(), m.redelivered])
                elif time.monotonic() > deadline:
                    raise SystemExit(f"basic.get on {c['queue']!r}: only {len(got)}/{c['count']}")
                else:
                    conn.sleep(0.02)
    deadline = time.monotonic() + 10
    while any(len(got) < c["count"] for got, c in zip(received, spec["channels"], strict=True)):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for deliveries: {received!r}")
        conn.process_data_events(time_limit=0.05)
    sock = _connection_socket(conn)
    print("READY " + json.dumps({"received": received}), flush=True)
    if spec["end"] == "shutdown":
        sys.stdin.readline()  # the test says when
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        print("SHUT", flush=True)
    while True:  # never touch the connection again; the test kills this process
        time.sleep(1)


if __name__ == "__main__":
    main()
