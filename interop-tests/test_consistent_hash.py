"""x-consistent-hash exchange (RabbitMQ's rabbitmq_consistent_hash_exchange plugin contract).

Skipped against a broker without the type (the reference RabbitMQ here runs without the
plugin: declaring it is 503 COMMAND_INVALID there).
"""
from __future__ import annotations

import collections

import pika
import pika.exceptions
import pytest
from helpers import assert_channel_error, drain


@pytest.fixture
def hash_exchange(connect, uid, cleanup):
    ch = connect().channel()
    name = cleanup.exchange(uid + "-x")
    try:
        ch.exchange_declare(name, "x-consistent-hash")
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-consistent-hash exchange type")
        raise
    return ch, name


def test_each_key_stays_on_one_partition_in_publish_order(hash_exchange, uid, cleanup):
    ch, x = hash_exchange
    parts = [cleanup.queue(f"{uid}-p{i}") for i in range(8)]
    for q in parts:
        ch.queue_declare(q)
        ch.queue_bind(q, x, "1")
    ch.confirm_delivery()
    sent = collections.defaultdict(list)
    for i in range(2000):
        key = f"customer-{i % 100}"
        ch.basic_publish(x, key, f"{key}:{i}".encode())
        sent[key].append(i)
    got: dict[str, list[int]] = collections.defaultdict(list)
    where: dict[str, set[str]] = collections.defaultdict(set)
    for q in parts:
        for _method, _props, body in drain(ch, q):
            key, seq = body.decode().split(":")
            got[key].append(int(seq))
            where[key].add(q)
    assert got == sent  # nothing lost, per-key publish order kept
    assert all(len(qs) == 1 for qs in where.values())  # one partition per key
    used = collections.Counter(next(iter(qs)) for qs in where.values())
    assert len(used) >= 6  # 100 keys spread over the 8 partitions


def test_hash_header_routes_by_header(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-hx")
    try:
        ch.exchange_declare(x, "x-consistent-hash", arguments={"hash-header": "tenant"})
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-consistent-hash exchange type")
        raise
    parts = [cleanup.queue(f"{uid}-h{i}") for i in range(4)]
    for q in parts:
        ch.queue_declare(q)
        ch.queue_bind(q, x, "10")
    ch.confirm_delivery()
    for i in range(40):
        ch.basic_publish(x, f"rk-{i}", b"t", pika.BasicProperties(headers={"tenant": "acme"}))
    counts = [ch.queue_declare(q, passive=True).method.message_count for q in parts]
    assert sorted(counts) == [0, 0, 0, 40]


def test_bad_weight_is_406(hash_exchange, uid, cleanup):
    ch, x = hash_exchange
    q = cleanup.queue(uid + "-w")
    ch.queue_declare(q)
    assert_channel_error(406, "PRECONDITION_FAILED - The binding key must be an integer",
                         ch.queue_bind, q, x, "heavy")
