"""Half messages through a broker Session (no sockets), timers on a fake clock.

Prepare / commit / rollback, confirms, the errors (unknown id, missing message_id, bad
headers, a conflicting decision), check-backs with backoff, the default decision, and
recovery of stored half messages from the journal (clean stop and crash).
"""
from __future__ import annotations

import os

import pytest
import trio

from broker.amqp import spec
from broker.broker import Broker
from broker.config import Config
from broker.persistence.journal import JournalStore
from broker.transactions import CONTROL_EXCHANGE, HELD_QUEUE
from broker.transactions.core import _resume
from broker.transactions.spec import (
    Policy,
    TransactionError,
    parse_decision,
    parse_prepare,
)

from ..support import channel_close, methods

PREPARE = {"x-transaction": "prepare"}


@pytest.fixture
def tx(broker, clock):
    broker.transactions.clock = clock  # wall clock of prepares = the fake clock
    return broker.transactions


@pytest.fixture
def client(session_client, tx):
    c = session_client()
    c.open_channel(1)
    c.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
    c.declare_queue(1, "orders", durable=True)
    return c


def half(c, txid="tx-1", body=b"order", headers=None, **props):
    props.setdefault("message_id", txid)
    return c.publish(1, body, "", "orders", headers={**PREPARE, **(headers or {})}, **props)


def decide(c, decision, txid="tx-1", **props):
    if txid is not None:
        props.setdefault("message_id", txid)
    return c.publish(1, b"", CONTROL_EXCHANGE, decision, **props)


def acks(written):
    return [(m.delivery_tag, m.multiple) for m in methods(written, spec.Basic.Ack)]


def get(c, queue="orders", channel=1):
    written = c.call(channel, spec.Basic.Get(queue=queue, no_ack=True))
    return written[0] if written and isinstance(written[0].method, spec.Basic.GetOk) else None


# ---------------------------------------------------------------- the contract, pure
def test_parse_prepare_and_policy():
    txid, policy = parse_prepare({**PREPARE, "x-transaction-timeout": "250",
                                  "x-transaction-check-max": 2,
                                  "x-transaction-default": b"commit"}, b"id-1")
    assert txid == "id-1" and policy == Policy(250, 2, "commit")
    # RocketMQ's timeout and check count; no default in the message: the queues decide
    assert parse_prepare(PREPARE, "x")[1] == Policy(6000, 15, None)


@pytest.mark.parametrize("headers,message_id,named", [
    (PREPARE, None, "missing property 'message_id'"),
    (PREPARE, "", "missing property 'message_id'"),
    ({"x-transaction": "commit"}, "a", "exchange 'amq.triomq.transaction'"),
    ({"x-transaction": "yes"}, "a", "invalid header 'x-transaction'"),
    ({**PREPARE, "x-transaction-timeout": 0}, "a", "invalid header 'x-transaction-timeout'"),
    ({**PREPARE, "x-transaction-timeout": "soon"}, "a", "invalid header 'x-transaction-timeout'"),
    ({**PREPARE, "x-transaction-check-max": -1}, "a", "invalid header 'x-transaction-check-max'"),
    ({**PREPARE, "x-transaction-check-max": True}, "a", "invalid header 'x-transaction-check-max'"),
    ({**PREPARE, "x-transaction-default": "maybe"}, "a", "invalid header 'x-transaction-default'"),
])
def test_parse_prepare_refuses(headers, message_id, named):
    with pytest.raises(TransactionError, match=named.replace("(", r"\(").replace(".", r"\.")):
        parse_prepare(headers, message_id)


def test_parse_decision():
    assert parse_decision("commit", {}, "a") == ("commit", "a")
    assert parse_decision("rollback", {"x-transaction-id": b"b"}, None) == ("rollback", "b")
    with pytest.raises(TransactionError, match="invalid routing key 'abort'"):
        parse_decision("abort", {}, "a")
    with pytest.raises(TransactionError, match="missing property 'message_id'"):
        parse_decision("commit", {}, None)


def test_backoff_doubles_up_to_the_cap():
    p = Policy(6000, 15, "rollback")
    assert [p.delay_ms(n) for n in range(1, 8)] == [6000, 12000, 24000, 48000, 60000, 60000, 60000]
    assert Policy(90_000, 3).delay_ms(3) == 90_000  # a timeout above the cap is its own cap
    assert p.due_ms(3) == 42000


def test_resume_after_restart():
    p = Policy(1000, 2, "rollback")  # checks at +1 s, +3 s; default at +7 s
    assert _resume(p, 0, 500) == (1, 1000)
    assert _resume(p, 0, 1500) == (2, 3000)    # the check due in the downtime is not repeated
    assert _resume(p, 0, 5000) == (3, 7000)
    assert _resume(p, 0, 60_000) == (2, 60_000)  # window over: one more check-back now
    assert _resume(Policy(1000, 0), 0, 60_000) == (1, 61_000)


# ---------------------------------------------------------------- commit and rollback
def test_commit_delivers_once_and_strips_transaction_headers(client, tx):
    w = half(client, headers={"app": "kept", "x-transaction-timeout": 5000}, delivery_mode=2)
    assert acks(w) == [(1, False)]                          # confirmed once held
    assert client.declare_queue(1, "orders", durable=True).message_count == 0  # invisible
    assert get(client) is None
    assert tx.pending_ids() == ["tx-1"]
    w = decide(client, "commit")
    assert acks(w) == [(2, False)]
    got = get(client)
    assert got is not None and got.body == b"order"
    assert got.headers == {"app": b"kept"}
    assert got.properties["message_id"] == "tx-1" and got.properties["delivery_mode"] == 2
    assert get(client) is None and tx.pending_ids() == []


def test_rollback_is_never_delivered(client, tx, clock):
    half(client)
    assert acks(decide(client, "rollback")) == [(2, False)]
    clock.advance(3600)
    assert get(client) is None and tx.pending_ids() == []


def test_commit_routes_through_the_original_exchange_as_it_is_then(client):
    client.ok(1, spec.Exchange.Declare(exchange="shop", type="topic"), spec.Exchange.DeclareOk)
    client.publish(1, b"x", "shop", "order.created", headers=PREPARE, message_id="t")
    client.ok(1, spec.Queue.Bind(queue="orders", exchange="shop", routing_key="order.*"),
              spec.Queue.BindOk)  # bound after the prepare: counts at commit time
    decide(client, "commit", "t")
    assert get(client).body == b"x"


def test_transaction_id_may_come_from_a_header(client):
    half(client)
    decide(client, "commit", None, headers={"x-transaction-id": "tx-1"})
    assert get(client).body == b"order"


def test_repeated_decision_is_harmless_a_conflicting_one_is_refused(client):
    half(client)
    decide(client, "commit")
    assert acks(decide(client, "commit")) == [(3, False)]  # e.g. a check-back answered twice
    close = channel_close(decide(client, "rollback"))
    assert close.reply_code == 406
    assert close.reply_text == ("PRECONDITION_FAILED - cannot rollback transaction 'tx-1' in "
                                "vhost '/': it was already committed")
    assert close.class_id == 60 and close.method_id == 40
    client.open_channel(2)
    assert get(client, channel=2).body == b"order"  # delivered once, not undone


def test_an_id_can_be_used_again_once_decided(client):
    half(client, body=b"first")
    decide(client, "rollback")
    half(client, body=b"second")
    decide(client, "commit")
    assert get(client).body == b"second"


# ---------------------------------------------------------------- bad input
def test_unknown_id_is_404_naming_it_and_changes_nothing(client, tx):
    half(client, txid="known")
    close = channel_close(decide(client, "commit", "nope"))
    assert (close.reply_code, close.reply_text) == (
        404, "NOT_FOUND - no transaction 'nope' in vhost '/'")
    assert tx.pending_ids() == ["known"]
    client.open_channel(2)
    assert get(client, channel=2) is None


@pytest.mark.parametrize("publish,text", [
    (lambda c: c.publish(1, b"x", "", "orders", headers=PREPARE),
     "PRECONDITION_FAILED - missing property 'message_id' (the transaction id) on a message "
     "with header 'x-transaction'"),
    (lambda c: half(c, headers={"x-transaction-timeout": -5}),
     "PRECONDITION_FAILED - invalid header 'x-transaction-timeout': expected an integer from 1"),
    (lambda c: half(c, headers={"AMQ_SCHEDULED_DELAY": 100}),
     "PRECONDITION_FAILED - invalid header 'AMQ_SCHEDULED_DELAY': a message with header "
     "'x-transaction' cannot be scheduled"),
    (lambda c: decide(c, "maybe"),
     "PRECONDITION_FAILED - invalid routing key 'maybe' for exchange 'amq.triomq.transaction'"),
    (lambda c: decide(c, "commit", None),
     "PRECONDITION_FAILED - missing property 'message_id' (or header 'x-transaction-id')"),
])
def test_bad_input_closes_the_channel_with_406(client, tx, publish, text):
    close = channel_close(publish(client))
    assert close.reply_code == 406 and close.reply_text.startswith(text), close.reply_text
    assert tx.pending_ids() == []


def test_a_prepared_id_cannot_be_prepared_again(client, tx):
    half(client, body=b"a")
    close = channel_close(half(client, body=b"b"))
    assert close.reply_text == ("PRECONDITION_FAILED - transaction 'tx-1' in vhost '/' is "
                                "already prepared")
    assert tx.pending_ids() == ["tx-1"]


def test_mandatory_is_not_checked_on_a_half_message(client, tx):
    w = client.publish(1, b"x", "", "no-such-queue", mandatory=True, headers=PREPARE,
                       message_id="m")
    assert methods(w, spec.Basic.Return) == [] and acks(w) == [(1, False)]
    assert tx.pending_ids() == ["m"]
    assert methods(decide(client, "commit", "m"), spec.Basic.Return) == []  # never returned


def test_internal_queue_and_control_exchange_as_clients_see_them(client):
    client.ok(1, spec.Exchange.Declare(exchange=CONTROL_EXCHANGE, passive=True),
              spec.Exchange.DeclareOk)
    half(client)
    close = channel_close(client.call(1, spec.Queue.Declare(queue=HELD_QUEUE, passive=True)))
    assert close.reply_code == 404
    client.open_channel(2)
    close = channel_close(client.call(2, spec.Exchange.Delete(exchange=CONTROL_EXCHANGE)))
    assert close.reply_code == 403


def test_tx_mode_channel_prepares_and_decides_at_tx_commit(session_client, tx):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "orders")
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    half(c)
    assert tx.pending_ids() == []
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    decide(c, "commit")
    assert tx.pending_ids() == ["tx-1"]
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    assert get(c).body == b"order"


# ---------------------------------------------------------------- check-backs and defaults
def test_check_backs_with_backoff_then_default_rollback(client, tx, clock):
    client.declare_queue(1, "producer.checks")
    half(client, headers={"x-transaction-timeout": 1000, "x-transaction-check-max": 2, "app": 1},
         reply_to="producer.checks")
    clock.advance(0.999)
    assert get(client, "producer.checks") is None           # never early
    clock.advance(0.002)
    check = get(client, "producer.checks")
    assert check.body == b"order"
    assert check.headers == {"app": 1, "x-transaction-check": 1,
                             "x-transaction-exchange": b"", "x-transaction-routing-key": b"orders"}
    assert check.properties["message_id"] == check.properties["correlation_id"] == "tx-1"
    assert check.properties["expiration"] == "2000"         # stale once the next one is due
    clock.advance(1.9)
    assert get(client, "producer.checks") is None
    clock.advance(0.2)                                      # +3 s: the second check-back
    assert get(client, "producer.checks").headers["x-transaction-check"] == 2
    clock.advance(3.8)
    assert tx.pending_ids() == ["tx-1"]
    clock.advance(0.3)                                      # +7 s: the default, rollback
    assert tx.pending_ids() == [] and get(client) is None and tx.stats["defaults"] == 1
    close = channel_close(decide(client, "commit"))
    assert close.reply_text == ("PRECONDITION_FAILED - cannot commit transaction 'tx-1' in vhost "
                                "'/': it was already rolled back by default after 2 check-backs")


def test_answering_a_check_back_from_another_connection(client, session_client, tx, clock):
    client.declare_queue(1, "producer.checks", durable=True)
    half(client, headers={"x-transaction-timeout": 500}, reply_to="producer.checks")
    client.drop()                                           # the producer crashes
    other = session_client()
    other.open_channel(1)
    clock.advance(0.5)
    check = get(other, "producer.checks")
    assert check.headers["x-transaction-check"] == 1
    decide(other, "commit", check.properties["correlation_id"])
    assert get(other).body == b"order"


def test_default_commit_and_no_check_without_reply_to(client, tx, clock):
    half(client, headers={"x-transaction-timeout": 100, "x-transaction-check-max": 1,
                          "x-transaction-default": "commit"})
    clock.advance(0.1)
    assert tx.stats["checks"] == 0 and get(client) is None
    clock.advance(0.2)
    assert get(client).body == b"order" and tx.stats["defaults"] == 1


def test_default_decided_per_destination_queue(session_client, tx, clock):
    """Without x-transaction-default in the message, each destination queue applies its own
    argument: committed into 'keep' (commit), rolled back for 'orders' (rollback unless set)."""
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "orders", durable=True)
    c.declare_queue(1, "keep", durable=True, arguments={"x-transaction-default": "commit"})
    for q in ("orders", "keep"):
        c.ok(1, spec.Queue.Bind(queue=q, exchange="amq.fanout"), spec.Queue.BindOk)
    c.publish(1, b"order", "amq.fanout", "", message_id="tx-q",
              headers={**PREPARE, "x-transaction-timeout": 100, "x-transaction-check-max": 0})
    clock.advance(0.2)
    assert tx.stats["defaults"] == 1 and tx.pending_ids() == []
    assert get(c, "keep").body == b"order" and get(c, "orders") is None
    # a message that says what it wants overrides the queues
    c.publish(1, b"order2", "amq.fanout", "", message_id="tx-r",
              headers={**PREPARE, "x-transaction-timeout": 100, "x-transaction-check-max": 0,
                       "x-transaction-default": "rollback"})
    clock.advance(0.2)
    assert get(c, "keep") is None and get(c, "orders") is None


def test_bad_queue_default_argument_is_refused(session_client):
    c = session_client()
    c.open_channel(1)
    written = c.call(1, spec.Queue.Declare(queue="q", arguments={"x-transaction-default": "maybe"}))
    closed = channel_close(written)
    assert closed.reply_code == 406 and "x-transaction-default" in closed.reply_text


# ---------------------------------------------------------------- recovery (journal)
def life(path, body, crash=False):
    """One broker lifetime on a journal in ``path`` (as tests/persistence do)."""
    async def main():
        # flush "async": a durable queue's declare-ok waits for the group commit, which no
        # task runs here while ``body`` (synchronous) works; what reaches the journal is
        # written by the explicit flush or close below, as a kill -9 would find it
        store = JournalStore(str(path), flush="async")
        broker = Broker(Config(data_dir=str(path)), store)
        await store.open()
        broker.recover()
        result = body(broker)
        if crash:
            await store._flush_once()
            os.close(store._lock_fd)
        else:
            await store.close()
        return result
    return trio.run(main)


@pytest.mark.parametrize("crash", [False, True])
def test_prepared_messages_survive_restart(tmp_path, crash):
    from ..support import SessionClient

    def first(broker):
        c = SessionClient(broker)
        c.open_channel(1)
        c.declare_queue(1, "orders", durable=True)
        for i in range(3):
            half(c, txid=f"t{i}", body=b"b%d" % i, delivery_mode=2, reply_to="checks",
                 headers={"x-transaction-timeout": 60_000})
        half(c, txid="transient", body=b"gone")              # not persistent: not kept
        decide(c, "rollback", "t1")
        c.drop()

    def second(broker):
        tx = broker.transactions
        assert sorted(tx.pending_ids()) == ["t0", "t2"]
        c = SessionClient(broker)
        c.open_channel(1)
        assert c.declare_queue(1, "orders", durable=True).message_count == 0
        decide(c, "commit", "t2")
        assert c.declare_queue(1, "orders", durable=True).message_count == 1
        c.drop()
        return tx.pending_ids()

    life(tmp_path, first, crash=crash)
    assert life(tmp_path, second, crash=crash) == ["t0"]
    # t2's commit reached the queue, and its half message is gone for good
    def third(broker):
        c = SessionClient(broker)
        c.open_channel(1)
        got = get(c)
        assert got.body == b"b2" and got.headers == {} and get(c) is None  # exactly once
        p = broker.transactions.table("/")["t0"]
        assert p.attempt == 1 and p.policy.timeout_ms == 60_000
        c.drop()
        return broker.transactions.pending_ids()
    assert life(tmp_path, third) == ["t0"]
