"""Limited-time orders: cancel orders left unpaid after N seconds -- no database polling.

When an order is created, the shop publishes one *persistent, delayed* message
(``x-delay`` = the payment window) to an ``x-delayed-message`` exchange. When it
falls due, the broker routes it to ``orders.payment-timeout``; the canceller
consumes it and cancels the order only if it is still unpaid (paying simply
flips the row; nothing has to be un-scheduled). The delayed message is durable:
a broker restart (or crash) in the middle does not lose the cancellation, and
deadlines that passed while the broker was down fire right after it is back.

    python docs/examples/limited_time_orders.py demo --url amqp://guest:guest@127.0.0.1:5672/ \\
        --window 3 --db /tmp/orders.db
    python docs/examples/limited_time_orders.py create ORDER-ID --window 600 ...
    python docs/examples/limited_time_orders.py pay ORDER-ID ...
    python docs/examples/limited_time_orders.py canceller ...   # runs until Ctrl-C
    python docs/examples/limited_time_orders.py status ...

Needs only pika and the standard library (sqlite3 stands in for the shop's database).
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
import time

import pika

EXCHANGE = "orders.delayed"
QUEUE = "orders.payment-timeout"
ROUTING_KEY = "order.payment-timeout"


# ------------------------------------------------------------------ the shop's database
def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, "
               "created REAL NOT NULL, deadline REAL NOT NULL, closed REAL)")
    return db


def status(db: sqlite3.Connection, order_id: str) -> str | None:
    row = db.execute("SELECT status FROM orders WHERE id = ?", (order_id,)).fetchone()
    return row[0] if row else None


def pay(db: sqlite3.Connection, order_id: str) -> bool:
    """Paid in time? (An order already cancelled cannot be paid.)"""
    cur = db.execute("UPDATE orders SET status = 'paid', closed = ? WHERE id = ? AND status = 'unpaid'",
                     (time.time(), order_id))
    return cur.rowcount == 1


def cancel_if_unpaid(db: sqlite3.Connection, order_id: str) -> bool:
    cur = db.execute("UPDATE orders SET status = 'cancelled', closed = ? "
                     "WHERE id = ? AND status = 'unpaid'", (time.time(), order_id))
    return cur.rowcount == 1


# ------------------------------------------------------------------ messaging
def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def declare(ch) -> None:
    ch.exchange_declare(EXCHANGE, "x-delayed-message", durable=True,
                        arguments={"x-delayed-type": "direct"})
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, EXCHANGE, ROUTING_KEY)


def create_order(ch, db: sqlite3.Connection, order_id: str, window_s: float) -> None:
    """Insert the order, then schedule its payment deadline (publisher-confirmed)."""
    now = time.time()
    db.execute("INSERT INTO orders (id, status, created, deadline) VALUES (?, 'unpaid', ?, ?)",
               (order_id, now, now + window_s))
    ch.basic_publish(EXCHANGE, ROUTING_KEY, order_id.encode(),
                     pika.BasicProperties(delivery_mode=2, content_type="text/plain",
                                          headers={"x-delay": int(window_s * 1000)}))


def run_canceller(url: str, db_path: str, stop_after: float | None = None, log=print) -> int:
    """Consume payment deadlines; returns how many orders were cancelled."""
    db = open_db(db_path)
    conn = connect(url)
    ch = conn.channel()
    declare(ch)
    ch.basic_qos(prefetch_count=50)
    cancelled = 0

    def on_deadline(c, method, props, body):
        nonlocal cancelled
        order_id = body.decode()
        if cancel_if_unpaid(db, order_id):
            cancelled += 1
            log(f"order {order_id}: not paid in time -> cancelled")
        else:
            log(f"order {order_id}: deadline passed, already {status(db, order_id)}")
        c.basic_ack(method.delivery_tag)  # after the database update: at-least-once, idempotent

    ch.basic_consume(QUEUE, on_deadline)
    deadline = None if stop_after is None else time.time() + stop_after
    try:
        while deadline is None or time.time() < deadline:
            conn.process_data_events(time_limit=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            conn.close()
        except Exception:
            pass
    return cancelled


def demo(url: str, db_path: str, window: float) -> int:
    db = open_db(db_path)
    conn = connect(url)
    ch = conn.channel()
    declare(ch)
    ch.confirm_delivery()
    stamp = int(time.time())
    ids = [f"order-{stamp}-{i}" for i in range(3)]
    for order_id in ids:
        create_order(ch, db, order_id, window)
    print(f"created {ids}; each must be paid within {window}s")
    pay(db, ids[1])
    print(f"{ids[1]} paid")
    conn.close()
    run_canceller(url, db_path, stop_after=window + 2)
    for order_id in ids:
        print(order_id, status(db, order_id))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("demo", "create", "pay", "canceller", "status"))
    p.add_argument("order_id", nargs="?")
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--db", default="orders.db", help="sqlite file standing in for the shop database")
    p.add_argument("--window", type=float, default=15 * 60,
                   help="payment window in seconds (default 900 = 15 minutes)")
    p.add_argument("--stop-after", type=float, default=None, help="canceller: exit after N s")
    a = p.parse_args(argv)
    if a.command == "demo":
        return demo(a.url, a.db, a.window)
    if a.command == "canceller":
        run_canceller(a.url, a.db, a.stop_after)
        return 0
    db = open_db(a.db)
    if a.command == "status":
        for row in db.execute("SELECT id, status FROM orders ORDER BY created"):
            print(*row)
        return 0
    if not a.order_id:
        p.error("order_id is required")
    if a.command == "pay":
        ok = pay(db, a.order_id)
        print("paid" if ok else f"cannot pay: {status(db, a.order_id)}")
        return 0 if ok else 1
    conn = connect(a.url)
    ch = conn.channel()
    declare(ch)
    ch.confirm_delivery()
    create_order(ch, db, a.order_id, a.window)
    conn.close()
    print(f"created {a.order_id}; pay within {a.window}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
