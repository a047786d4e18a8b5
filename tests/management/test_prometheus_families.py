"""/metrics against rabbitmq_prometheus: the family set, types and label names compared with the
machine's RabbitMQ (:15692; skipped when its plugin is off), and the auth-attempt, channel and
global counters moved by real clients (pika, paho MQTT, HTTP)."""
from __future__ import annotations

import re

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

RABBITMQ_METRICS = "http://127.0.0.1:15692/metrics"

# RabbitMQ families this broker does not serve, and why: Erlang VM internals, the Raft log of
# quorum queues, the classic queue index/message store and file-handle cache, the stream
# plugin's per-error counters, Mnesia, and the paging (ram/disk) split of classic queues
NOT_SERVED = re.compile(
    r"^(erlang_|telemetry_|rabbitmq_erlang_|rabbitmq_raft_|rabbitmq_io_|rabbitmq_msg_store_"
    r"|rabbitmq_queue_index_|rabbitmq_queue_disk_|rabbitmq_schema_db_"
    r"|rabbitmq_global_stream_error_|rabbitmq_.*_process_reductions"
    r"|rabbitmq_queue_messages_(paged_out|ram|ready_ram|unacked_ram|persistent)"
    r"|rabbitmq_queue_(process_memory_bytes|consumer_capacity|consumer_utilisation)"
    r"|rabbitmq_channel_(acks_uncommitted|messages_uncommitted)"
    r"|rabbitmq_connection_pending_packets"
    r"|rabbitmq_global_messages_dead_lettered_confirmed)")

# the families RabbitMQ's Grafana dashboards and alerts read that this change added
NEW = ("rabbitmq_auth_attempts", "rabbitmq_auth_attempts_succeeded",
       "rabbitmq_auth_attempts_failed", "rabbitmq_global_messages_routed",
       "rabbitmq_global_messages_received_confirm", "rabbitmq_alarms_file_descriptor_limit",
       "rabbitmq_connection_channels", "rabbitmq_channel_messages_unacked",
       "rabbitmq_channel_prefetch", "rabbitmq_consumer_prefetch", "process_start_time_seconds",
       "rabbitmq_queue_messages_bytes", "rabbitmq_queue_messages_unacked_bytes",
       "rabbitmq_queue_messages_ready_bytes")

# the protocol label's values: RabbitMQ 3.10's (amqp091, stream) and those of its later
# native MQTT (3.12) and AMQP 1.0 (4.0); STOMP counts as amqp091 as in RabbitMQ
RABBITMQ_PROTOCOLS = {"amqp091", "stream", "mqtt310", "mqtt311", "mqtt50", "amqp10"}


OBJECT_LABELS = {"vhost", "queue", "channel", "connection", "exchange"}


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, label names over all samples)."""
    out = {}
    for f in text_string_to_metric_families(text):
        labels = frozenset(k for s in f.samples for k in s.labels)
        out[f.name] = (f.type, labels)
    return out


def values(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _pika_logins(port: int) -> None:
    for password in ("wrong", "wrong"):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials("guest", password),
                connection_attempts=1))
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("fam-q")
    ch.basic_publish("", "fam-q", b"routed")
    ch.basic_publish("", "nowhere", b"dropped")
    conn.close()


def _mqtt_login(port: int, password: str) -> int:
    """The CONNACK reason code paho reports (0: accepted)."""
    result: list[int] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fam-" + password,
                         protocol=mqtt.MQTTv311)
    client.username_pw_set("guest", password)
    client.on_connect = lambda c, u, flags, rc, props: result.append(rc.value)
    client.connect("127.0.0.1", port)
    while not result:
        client.loop(timeout=1.0)
    client.disconnect()
    return result[0]


async def _scrape(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(url)
        assert r.status_code == 200
        return r.text


async def test_logins_move_auth_attempt_counters(http_broker):
    before = values(await _scrape(http_broker.url + "/metrics"))
    assert ("rabbitmq_auth_attempts_total", (("protocol", "amqp091"),)) not in before
    await trio.to_thread.run_sync(_pika_logins, http_broker.amqp_port)
    async with http_broker.client("guest", "nope") as bad:
        assert (await bad.get("/api/overview")).status_code == 401
    async with http_broker.client() as good:
        assert (await good.get("/api/whoami")).status_code == 200
    v = values(await _scrape(http_broker.url + "/metrics"))
    amqp = (("protocol", "amqp091"),)
    assert v[("rabbitmq_auth_attempts_total", amqp)] == 3
    assert v[("rabbitmq_auth_attempts_succeeded_total", amqp)] == 1
    assert v[("rabbitmq_auth_attempts_failed_total", amqp)] == 2
    http = (("protocol", "http"),)
    assert v[("rabbitmq_auth_attempts_failed_total", http)] == 1
    assert v[("rabbitmq_auth_attempts_succeeded_total", http)] >= 1
    assert v[("rabbitmq_global_messages_routed_total", amqp)] == 1
    assert v[("rabbitmq_global_messages_received_confirm_total", amqp)] == 2
    detailed = values(await _scrape(
        http_broker.url + "/metrics/detailed?family=auth_attempt_metrics"))
    assert detailed[("rabbitmq_detailed_auth_attempts_failed_total", amqp)] == 2
    assert v[("process_start_time_seconds", ())] > 0


async def test_mqtt_logins_count_as_mqtt(nursery, tmp_path):
    from .conftest import start_http_broker
    hb = await start_http_broker(nursery, tmp_path, mqtt_port=0)
    with trio.fail_after(10):
        while "mqtt" not in hb.broker.mqtt.ports:  # noqa: ASYNC110 - binds after AMQP
            await trio.sleep(0.01)
    port = hb.broker.mqtt.ports["mqtt"]
    assert await trio.to_thread.run_sync(_mqtt_login, port, "wrong") != 0
    assert await trio.to_thread.run_sync(_mqtt_login, port, "guest") == 0
    v = values(await _scrape(hb.url + "/metrics"))
    mq = (("protocol", "mqtt"),)
    assert v[("rabbitmq_auth_attempts_failed_total", mq)] == 1
    assert v[("rabbitmq_auth_attempts_succeeded_total", mq)] == 1
    await hb.server.shutdown()


async def test_families_and_labels_as_rabbitmq(http_broker):
    try:
        reference = families(await _scrape(RABBITMQ_METRICS))
    except (httpx.HTTPError, AssertionError):
        pytest.skip("RabbitMQ's rabbitmq_prometheus (:15692) is not reachable")
    # one login of each kind, so that the per-protocol families carry their labels
    await trio.to_thread.run_sync(_pika_logins, http_broker.amqp_port)
    ours = families(await _scrape(http_broker.url + "/metrics"))
    missing = sorted(n for n in reference if n not in ours and not NOT_SERVED.match(n))
    assert missing == []
    for name in NEW:
        assert name in reference, name  # still a RabbitMQ name
    # every family both serve: same type, and the same label names unless RabbitMQ was
    # switched to per-object series (object labels, which aggregated /metrics has not)
    differ = {n: (ours[n], reference[n]) for n in reference
              if n in ours and ours[n][0] != reference[n][0]}
    assert differ == {}, differ
    for name, (_type, labels) in reference.items():
        if name in ours and not labels & OBJECT_LABELS and (labels or name in NEW):
            assert ours[name][1] == labels, name
    # the per-protocol split: each global family RabbitMQ labels by protocol, with the
    # label values RabbitMQ serves (all of the reference's, none it does not have)
    ref_values = values(await _scrape(RABBITMQ_METRICS))
    our_values = values(await _scrape(http_broker.url + "/metrics"))
    for name in ("rabbitmq_global_messages_received_total", "rabbitmq_global_publishers",
                 "rabbitmq_global_messages_routed_total", "rabbitmq_global_consumers"):
        ref = {dict(labels)["protocol"] for n, labels in ref_values if n == name}
        got = {dict(labels)["protocol"] for n, labels in our_values if n == name}
        assert ref <= got <= RABBITMQ_PROTOCOLS, (name, ref, got)
    # the queue byte gauges as RabbitMQ serves them per object
    per_object = families(await _scrape(RABBITMQ_METRICS + "/per-object"))
    ours_per_object = families(await _scrape(http_broker.url + "/metrics/per-object"))
    for name in ("rabbitmq_queue_messages_bytes", "rabbitmq_queue_messages_unacked_bytes",
                 "rabbitmq_queue_messages_ready_bytes"):
        assert per_object[name][0] == ours_per_object[name][0] == "gauge"
        if per_object[name][1]:  # RabbitMQ has a queue to label
            assert ours_per_object[name][1] == per_object[name][1], name
