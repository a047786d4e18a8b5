"""Delayed and scheduled delivery with real clients (pika, aio-pika).

Covers the x-delayed-message exchange (RabbitMQ plugin contract), ActiveMQ-style
AMQ_SCHEDULED_* headers, refusal of bad input, the `scheduled` CLI (online and
offline), and durability across a clean restart and kill -9 for each store
backend available (the default journal and sqlite).

These tests start their own brokers (own data dir, free port) so they can kill
and restart them; they are skipped when the suite runs against --broker-url.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import brokerproc
import pika
import pika.exceptions
import pytest

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def store_available(kind: str) -> str | None:
    """None when usable, else why not."""
    try:
        if kind == "journal":
            import broker.persistence.journal
        elif kind == "sqlite":
            import broker.persistence.sql  # noqa: F401
    except ModuleNotFoundError as exc:
        return f"store backend {kind!r} not importable yet ({exc})"
    return None


class BrokerProc(brokerproc.BrokerProc):
    """The shared broker subprocess (store given as command-line arguments) with the
    ``scheduled`` CLI."""

    def __init__(self, data_dir: Path, store_args=()):
        super().__init__(data_dir, extra=store_args)

    def kill9(self) -> None:
        self.stop(hard=True)

    def cli(self, *args, check=True) -> subprocess.CompletedProcess:
        cmd = [PY, "-m", "broker", "scheduled", *args, "--data-dir", str(self.data_dir),
               *self.extra]
        r = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def cli_json(self, *args) -> dict:
        return json.loads(self.cli(*args, "--json").stdout)


@pytest.fixture
def make_broker(tmp_path, external_broker):
    if external_broker:
        pytest.skip("needs a TrioMQ it can restart (not --broker-url)")
    started = []

    def make(store_args=(), name="data"):
        b = BrokerProc(tmp_path / name, store_args)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(make_broker):
    return make_broker().start()


STORES = ["journal", "sqlite"]


@pytest.fixture(params=STORES)
def durable_broker(request, make_broker, tmp_path):
    why = store_available(request.param)
    if why:
        pytest.skip(why)
    args = [] if request.param == "journal" else ["--store", f"sqlite:///{tmp_path}/sched.db"]
    return make_broker(args)


def drain(conn, ch, queue, until, want=None):
    """Consume from queue until time `until` (or `want` messages); returns [(t, props, body)]."""
    got = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append((time.time(), p, b)), auto_ack=True)
    while time.time() < until and (want is None or len(got) < want):
        conn.process_data_events(time_limit=min(0.05, max(0.0, until - time.time())))
    ch.basic_cancel(tag)
    return got


# ----------------------------------------------------------------- x-delayed-message
def test_delayed_exchange_routes_when_due(broker):
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare("dq")
    ch.queue_bind("dq", "dx", "k")
    ch.confirm_delivery()
    t0 = time.time()
    ch.basic_publish("dx", "k", b"late", pika.BasicProperties(headers={"x-delay": 600}))
    ch.basic_publish("dx", "k", b"now")  # no x-delay: routed at once
    got = drain(conn, ch, "dq", t0 + 3, want=2)
    assert [b for _, _, b in got] == [b"now", b"late"]
    assert got[0][0] - t0 < 0.4
    assert got[1][0] - t0 >= 0.6
    assert got[1][0] - t0 < 1.5
    assert got[1][1].headers["x-delay"] == -600  # as the plugin: negated on delivery
    conn.close()


@pytest.mark.parametrize("xtype,key,bind_key,bind_args,headers", [
    ("fanout", "any", "", None, {}),
    ("topic", "a.b.c", "a.#", None, {}),
    ("headers", "", "", {"x-match": "all", "color": "red"}, {"color": "red"}),
])
def test_delayed_exchange_types(broker, xtype, key, bind_key, bind_args, headers):
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": xtype})
    ch.queue_declare("dq")
    ch.queue_bind("dq", "dx", bind_key, arguments=bind_args)
    t0 = time.time()
    ch.basic_publish("dx", key, b"m", pika.BasicProperties(headers={"x-delay": 300, **headers}))
    got = drain(conn, ch, "dq", t0 + 3, want=1)
    assert len(got) == 1 and got[0][0] - t0 >= 0.3
    conn.close()


@pytest.mark.parametrize("args", [{}, {"x-delayed-type": "nope"},
                                  {"x-delayed-type": "x-delayed-message"}])
def test_delayed_exchange_needs_delayed_type(broker, args):
    conn = broker.connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_declare("bad", "x-delayed-message", arguments=args)
    assert exc.value.reply_code == 406
    assert "Invalid argument, 'x-delayed-type' must be an existing exchange type" in exc.value.reply_text
    conn.close()


def test_delayed_mandatory_confirm_and_alternate_exchange(broker):
    """Plugin contract: confirm on accept; mandatory cannot be honoured at publish time
    (basic.return NO_ROUTE at once, message still delayed); the alternate exchange is
    used when the message is routed (due) and nothing matches."""
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("ae", "fanout")
    ch.queue_declare("aeq")
    ch.queue_bind("aeq", "ae", "")
    ch.exchange_declare("dx", "x-delayed-message",
                        arguments={"x-delayed-type": "direct", "alternate-exchange": "ae"})
    ch.queue_declare("dq")
    ch.queue_bind("dq", "dx", "k")
    ch.confirm_delivery()
    t0 = time.time()
    with pytest.raises(pika.exceptions.UnroutableError) as exc:
        # pika: acked (not nacked) *and* returned 312 NO_ROUTE before the ack
        ch.basic_publish("dx", "k", b"mand", pika.BasicProperties(headers={"x-delay": 500}),
                         mandatory=True)
    assert [(m.method.reply_code, m.body) for m in exc.value.messages] == [(312, b"mand")]
    ch.basic_publish("dx", "unbound", b"to-ae", pika.BasicProperties(headers={"x-delay": 500}))
    assert ch.basic_get("aeq", auto_ack=True)[0] is None  # not before it is due
    got = drain(conn, ch, "dq", t0 + 3, want=1)
    assert [b for _, _, b in got] == [b"mand"] and got[0][0] - t0 >= 0.5
    deadline = time.time() + 3
    while True:
        m = ch.basic_get("aeq", auto_ack=True)
        if m[0] is not None:
            assert m[2] == b"to-ae"
            break
        assert time.time() < deadline
        conn.sleep(0.05)
    conn.close()


# ----------------------------------------------------------------- ActiveMQ headers
def test_amq_delay_period_repeat_aio_pika(broker):
    import aio_pika

    async def run():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("amq", auto_delete=False)
            t0 = time.time()
            await ch.default_exchange.publish(
                aio_pika.Message(b"tick", headers={"AMQ_SCHEDULED_DELAY": 300,
                                                   "AMQ_SCHEDULED_PERIOD": 200,
                                                   "AMQ_SCHEDULED_REPEAT": 3}),
                routing_key="amq")
            times = []
            async with q.iterator() as it:
                async for msg in it:
                    async with msg.process():
                        times.append(time.time() - t0)
                    if len(times) == 4:
                        break
            await asyncio.sleep(0.5)
            extra = await q.get(no_ack=True, fail=False)
            return times, extra

    times, extra = asyncio.run(asyncio.wait_for(run(), 20))
    assert extra is None  # four deliveries, not five
    for i, t in enumerate(times):
        assert t >= 0.3 + 0.2 * i, times  # never early
        assert t < 0.3 + 0.2 * i + 0.5, times


def test_amq_cron_runs_and_cli_remove(broker):
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("cq")
    # croniter's optional 6th field is seconds: every second, each run = 2 deliveries 100 ms apart
    ch.basic_publish("", "cq", b"c", pika.BasicProperties(headers={
        "AMQ_SCHEDULED_CRON": "* * * * * *", "AMQ_SCHEDULED_PERIOD": 100,
        "AMQ_SCHEDULED_REPEAT": 1}))
    got = drain(conn, ch, "cq", time.time() + 2.6)
    assert len(got) >= 4, got
    listing = broker.cli_json("list")
    assert len(listing["items"]) == 1 and listing["items"][0]["cron"] == "* * * * * *"
    sid = listing["items"][0]["id"]
    assert broker.cli("remove", sid).returncode == 0
    assert broker.cli("remove", sid, check=False).returncode == 1
    conn.sleep(0.3)
    ch.queue_purge("cq")
    assert drain(conn, ch, "cq", time.time() + 1.5) == []
    conn.close()


def test_amq_mandatory_unroutable_returned_not_scheduled(broker):
    conn = broker.connect()
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m.reply_text))
    ch.basic_publish("", "no-such-queue", b"x", pika.BasicProperties(
        headers={"AMQ_SCHEDULED_DELAY": 200}), mandatory=True)
    conn.process_data_events(time_limit=0.3)
    assert returned == ["NO_ROUTE"]
    assert broker.cli_json("stats")["stats"]["pending"] == 0
    conn.close()


@pytest.mark.parametrize("headers,named", [
    ({"AMQ_SCHEDULED_DELAY": -5}, "AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_DELAY": "soon"}, "AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_DELAY": "1.5"}, "AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_CRON": "61 * * * *"}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": "not a cron"}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_DELAY": 100, "AMQ_SCHEDULED_PERIOD": 100}, "AMQ_SCHEDULED_PERIOD"),
    ({"AMQ_SCHEDULED_REPEAT": 3}, "AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_REPEAT": -1, "AMQ_SCHEDULED_PERIOD": 10}, "AMQ_SCHEDULED_REPEAT"),
])
def test_bad_schedule_headers_refused(broker, headers, named):
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("bq")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_publish("", "bq", b"x", pika.BasicProperties(headers=headers))
        ch.queue_declare("bq", passive=True)  # round trip to see the close
    assert exc.value.reply_code == 406
    assert named in exc.value.reply_text
    assert broker.cli_json("stats")["stats"]["pending"] == 0  # nothing half-scheduled
    conn.close()


@pytest.mark.parametrize("value", [-1, "abc", True])
def test_bad_x_delay_refused(broker, value):
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_publish("dx", "k", b"x", pika.BasicProperties(headers={"x-delay": value}))
        ch.exchange_declare("dx", passive=True)
    assert exc.value.reply_code == 406 and "x-delay" in exc.value.reply_text
    conn.close()


def test_internal_queue_invisible(broker):
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("v")
    ch.basic_publish("", "v", b"x", pika.BasicProperties(headers={"AMQ_SCHEDULED_DELAY": 5000}))
    for op in (lambda c: c.queue_declare("amq.triomq.scheduled", passive=True),
               lambda c: c.queue_declare("amq.triomq.scheduled"),
               lambda c: c.basic_get("amq.triomq.scheduled"),
               lambda c: c.queue_purge("amq.triomq.scheduled"),
               lambda c: c.queue_bind("amq.triomq.scheduled", "amq.direct", "x")):
        c = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            op(c)
        # invisible as RabbitMQ's internal entities: 404, and 403 for declaring an amq. name
        assert exc.value.reply_code in (403, 404)
        if exc.value.reply_code == 404:
            assert "no queue 'amq.triomq.scheduled'" in exc.value.reply_text
    c = conn.channel()
    c.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):  # not routed to it by name
        c.basic_publish("", "amq.triomq.scheduled", b"intruder", mandatory=True)
    c.queue_delete("amq.triomq.scheduled")  # as a missing queue: delete-ok, nothing deleted
    c.queue_unbind("amq.triomq.scheduled", "amq.direct", "x")  # idempotent, as for a missing one
    assert broker.cli_json("stats")["stats"]["pending"] == 1
    conn.close()


def test_cli_list_remove_all_stats_online(broker):
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("m")
    for i in range(5):
        ch.basic_publish("", "m", b"%d" % i, pika.BasicProperties(
            headers={"AMQ_SCHEDULED_DELAY": 60000 + i}))
    conn.sleep(0.2)
    stats = broker.cli_json("stats")["stats"]
    assert stats["pending"] == 5 and stats["pending_by_kind"] == {"amq": 5}
    text = broker.cli("list").stdout
    assert "5 pending" in text
    assert broker.cli_json("remove-all")["removed"] == 5
    assert broker.cli_json("stats")["stats"]["pending"] == 0
    conn.close()


# ----------------------------------------------------------------- durability
def _declare(ch):
    ch.exchange_declare("dx", "x-delayed-message", durable=True,
                        arguments={"x-delayed-type": "direct"})
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "k")


def _get_all(ch, queue):
    out = []
    while True:
        m = ch.basic_get(queue, auto_ack=True)
        if m[0] is None:
            return out
        out.append(m[2])


@pytest.mark.timeout(120)
# each store once and each way down once (16 s a case on CI's clock)
@pytest.mark.parametrize("durable_broker,how", [("journal", "kill9"), ("sqlite", "restart")],
                         indirect=["durable_broker"])
def test_durable_across_restart(durable_broker, how):
    b = durable_broker.start()
    conn = b.connect()
    ch = conn.channel()
    _declare(ch)
    ch.confirm_delivery()
    persistent = dict(delivery_mode=2)
    # due while the broker is down, but not before the stats below (a CLI process start
    # takes seconds on a loaded machine)
    t_pub = time.time()
    for i in range(20):
        ch.basic_publish("dx", "k", b"soon-%d" % i,
                         pika.BasicProperties(headers={"x-delay": 5000}, **persistent))
    ch.basic_publish("dx", "k", b"later", pika.BasicProperties(headers={"x-delay": 14000},
                                                                **persistent))
    ch.basic_publish("", "dq", b"rep", pika.BasicProperties(headers={
        "AMQ_SCHEDULED_DELAY": 4500, "AMQ_SCHEDULED_PERIOD": 300, "AMQ_SCHEDULED_REPEAT": 2},
        **persistent))
    ch.basic_publish("dx", "k", b"transient", pika.BasicProperties(headers={"x-delay": 5000}))
    assert b.cli_json("stats")["stats"]["pending"] == 23
    conn.close()
    b.kill9() if how == "kill9" else b.stop()
    # "soon" and the repeats fall due while the broker is down
    time.sleep(max(0.0, t_pub + 6.0 - time.time()))
    t_start = time.time()
    b.start()
    conn = b.connect()
    ch = conn.channel()
    deadline = time.time() + 3
    got = []
    while len(got) < 23 and time.time() < deadline:
        got += _get_all(ch, "dq")
        conn.sleep(0.05)
    soon = sorted(x for x in got if x.startswith(b"soon"))
    assert soon == sorted(b"soon-%d" % i for i in range(20))  # all, exactly once
    assert got.count(b"rep") == 3
    assert time.time() - t_start < 6  # overdue ones came promptly
    assert b"later" not in got and b"transient" not in got  # transient: not kept, as documented
    assert [i["kind"] for i in b.cli_json("list")["items"]] == ["delay"]
    got2 = drain(conn, ch, "dq", t_pub + 24, want=1)
    assert [x for _, _, x in got2] == [b"later"]
    assert b.cli_json("stats")["stats"]["pending"] == 0
    conn.close()


@pytest.mark.timeout(150)
def test_kill9_while_firing_loses_nothing_and_fires_nothing_early(durable_broker):
    """kill -9 in the middle of a stream of due messages, after a clean restart (so the
    journal's timer index is on disk and used): every message arrives, none before its due
    time, and only occurrences caught between "routed" and "removed" may come twice."""
    n = 2000
    b = durable_broker.start()
    conn = b.connect()
    ch = conn.channel()
    _declare(ch)
    first_due = time.time() + 10.0  # then one due every ms, whatever the publishing takes
    due = {}
    for i in range(n):
        body = b"f-%04d" % i
        delay = int((first_due + i / 1000.0 - time.time()) * 1000) + 1
        due[body] = time.time() + delay / 1000.0  # not later than the broker's due time
        ch.basic_publish("dx", "k", body, pika.BasicProperties(
            headers={"x-delay": delay}, delivery_mode=2))
    conn.close()
    b.stop()
    b.start()
    assert time.time() < first_due - 1, "publishing and a restart took too long to test"
    assert b.cli_json("stats")["stats"]["pending"] == n
    got: list = []

    def on_message(c, m, p, body):
        # manual acks: what is in flight at the kill comes back (no-ack deliveries the
        # client had not read yet would be gone, as RabbitMQ's are)
        got.append((time.time(), body))
        c.basic_ack(m.delivery_tag)

    conn = b.connect()
    ch = conn.channel()
    ch.basic_consume("dq", on_message)
    kill_at = first_due + 0.8  # about 800 fired, the rest still pending
    while time.time() < kill_at:
        conn.process_data_events(time_limit=0.02)
    b.kill9()
    before = len(got)
    b.start()
    conn = b.connect()
    ch = conn.channel()
    ch.basic_consume("dq", on_message)
    deadline = max(due.values()) + 20
    while time.time() < deadline and len({x for _, x in got}) < n:
        conn.process_data_events(time_limit=0.05)
    conn.close()
    bodies = [x for _, x in got]
    assert set(bodies) == set(due), f"lost {len(set(due) - set(bodies))} of {n}"
    early = [x for t, x in got if t < due[x] - 0.005]
    assert not early, f"{len(early)} fired early"
    dups = len(bodies) - n
    assert 0 < before < n and dups <= 2000, (before, dups)


@pytest.mark.timeout(120)
def test_cli_offline_remove(durable_broker):
    b = durable_broker.start()
    conn = b.connect()
    ch = conn.channel()
    _declare(ch)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("dx", "k", b"%d" % i, pika.BasicProperties(
            delivery_mode=2, headers={"x-delay": 4000}))
    conn.close()
    b.stop()
    listing = b.cli_json("list")
    assert listing.get("offline") is True and len(listing["items"]) == 3
    sid = listing["items"][0]["id"]
    assert b.cli_json("remove", sid)["ok"] is True
    assert len(b.cli_json("list")["items"]) == 2
    b.start()
    conn = b.connect()
    ch = conn.channel()
    got = drain(conn, ch, "dq", time.time() + 6, want=2)
    assert len(got) == 2
    conn.close()


@pytest.mark.timeout(60)
def test_memory_store_does_not_persist(make_broker):
    b = make_broker(["--store", "memory"]).start()
    conn = b.connect()
    ch = conn.channel()
    ch.queue_declare("m")
    ch.basic_publish("", "m", b"x", pika.BasicProperties(delivery_mode=2,
                                                         headers={"AMQ_SCHEDULED_DELAY": 300}))
    conn.close()
    b.stop()
    b.start()
    assert b.cli_json("stats")["stats"]["pending"] == 0


# ----------------------------------------------------------------- example: limited-time orders
@pytest.mark.timeout(120)
# kill -9 only: the example is what is under test here; a clean restart against a kill -9 is
# test_durable_across_restart's (16 s a case on CI's clock)
@pytest.mark.parametrize("how", ["kill9"])
def test_limited_time_orders_example_survives_broker_restart(durable_broker, tmp_path, how):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "limited_time_orders", REPO / "docs" / "examples" / "limited_time_orders.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    b = durable_broker.start()
    db_path = str(tmp_path / "orders.db")
    db = ex.open_db(db_path)
    conn = b.connect()
    ch = conn.channel()
    ex.declare(ch)
    ch.confirm_delivery()
    t0 = time.time()
    # o-late's deadline is far enough for a slow restart on a loaded machine
    for oid in ("o-paid", "o-unpaid", "o-late"):
        ex.create_order(ch, db, oid, 1.5 if oid != "o-late" else 12.0)
    conn.close()
    assert ex.pay(db, "o-paid")
    b.kill9() if how == "kill9" else b.stop()  # the broker goes down in the middle
    time.sleep(2.0)  # o-paid / o-unpaid deadlines pass while it is down
    b.start()
    logs = []
    ex.run_canceller(b.url, db_path, stop_after=1.5, log=logs.append)
    assert ex.status(db, "o-unpaid") == "cancelled"
    assert ex.status(db, "o-paid") == "paid"
    assert ex.status(db, "o-late") == "unpaid"  # not yet due
    assert ex.pay(db, "o-late")  # paid in time: the deadline will find it paid
    ex.run_canceller(b.url, db_path, stop_after=max(2.0, t0 + 15.0 - time.time()),
                     log=logs.append)
    assert ex.status(db, "o-late") == "paid"
    assert sum("o-unpaid" in line and "cancelled" in line for line in logs) == 1
    assert any("o-late" in line and "already paid" in line for line in logs)
