"""RabbitMQ's official Grafana dashboard (RabbitMQ-Overview, grafana.com id 10991) against this
broker, evaluated by a real Prometheus (Debian's package): every panel query returns data, as
it does against RabbitMQ with rabbitmq_prometheus. Also the /metrics/detailed filters.

A private prometheus scrapes TrioMQ (and RabbitMQ's :15692 when its rabbitmq_prometheus plugin
is on; that side is skipped otherwise) every second while pika publishes, consumes, gets,
declares and deletes; each query is then asked through /api/v1/query."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pika
import pytest

REPO = Path(__file__).resolve().parents[2]
RABBITMQ_METRICS = ("127.0.0.1", 15692)

# The panel queries of rabbitmq-server's deps/rabbitmq_prometheus/docker/grafana/dashboards/
# RabbitMQ-Overview.json (version 20210322), in panel order, as written there; the dashboard's
# template variables are substituted by ``expand``.
JOIN = ('* on(instance) group_left(rabbitmq_cluster) rabbitmq_identity_info'
        '{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace"}')
NJOIN = ('* on(instance) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info'
         '{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace"}')


def _by_node(expr: str) -> str:
    return f"sum({expr} {NJOIN}) by(rabbitmq_node)"


DASHBOARD_QUERIES = [
    f"sum(rabbitmq_queue_messages_ready {JOIN})",
    f"sum(rate(rabbitmq_channel_messages_published_total[60s]) {JOIN})",
    f"sum(rabbitmq_channels {JOIN}) - sum(rabbitmq_channel_consumers {JOIN})",
    f"sum(rabbitmq_connections {JOIN})",
    f"sum(rabbitmq_queues {JOIN})",
    f"sum(rabbitmq_queue_messages_unacked {JOIN})",
    f"sum(rate(rabbitmq_channel_messages_redelivered_total[60s]) {JOIN}) +\n"
    f"sum(rate(rabbitmq_channel_messages_delivered_total[60s]) {JOIN}) +\n"
    f"sum(rate(rabbitmq_channel_messages_delivered_ack_total[60s]) {JOIN}) +\n"
    f"sum(rate(rabbitmq_channel_get_total[60s]) {JOIN}) +\n"
    f"sum(rate(rabbitmq_channel_get_ack_total[60s]) {JOIN})",
    f"sum(rabbitmq_channel_consumers {JOIN})",
    f"sum(rabbitmq_channels {JOIN})",
    f"sum(rabbitmq_build_info {JOIN})",
    f"rabbitmq_build_info {NJOIN}",
    f"(rabbitmq_resident_memory_limit_bytes {NJOIN}) -\n"
    f"(rabbitmq_process_resident_memory_bytes {NJOIN})",
    f"rabbitmq_disk_space_available_bytes {NJOIN}",
    f"(rabbitmq_process_max_fds {NJOIN}) -\n(rabbitmq_process_open_fds {NJOIN})",
    f"(rabbitmq_process_max_tcp_sockets {NJOIN}) -\n(rabbitmq_process_open_tcp_sockets {NJOIN})",
    _by_node("rabbitmq_queue_messages_ready"),
    _by_node("rabbitmq_queue_messages_unacked"),
    _by_node("rate(rabbitmq_channel_messages_published_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_confirmed_total[60s])"),
    _by_node("rate(rabbitmq_queue_messages_published_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_unconfirmed[60s])"),
    _by_node("rate(rabbitmq_channel_messages_unroutable_dropped_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_unroutable_returned_total[60s])"),
    f"sum(\n  (rate(rabbitmq_channel_messages_delivered_total[60s]) {NJOIN}) +\n"
    f"  (rate(rabbitmq_channel_messages_delivered_ack_total[60s]) {NJOIN})\n) by(rabbitmq_node)",
    _by_node("rate(rabbitmq_channel_messages_redelivered_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_delivered_ack_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_delivered_total[60s])"),
    _by_node("rate(rabbitmq_channel_messages_acked_total[60s])"),
    _by_node("rate(rabbitmq_channel_get_total[60s])"),
    _by_node("rate(rabbitmq_channel_get_empty_total[60s])"),
    _by_node("rate(rabbitmq_channel_get_ack_total[60s])"),
    f"rabbitmq_queues {NJOIN}",
    _by_node("rate(rabbitmq_queues_declared_total[60s])"),
    _by_node("rate(rabbitmq_queues_created_total[60s])"),
    _by_node("rate(rabbitmq_queues_deleted_total[60s])"),
    f"rabbitmq_channels {NJOIN}",
    _by_node("rate(rabbitmq_channels_opened_total[60s])"),
    _by_node("rate(rabbitmq_channels_closed_total[60s])"),
    f"rabbitmq_connections {NJOIN}",
    _by_node("rate(rabbitmq_connections_opened_total[60s])"),
    _by_node("rate(rabbitmq_connections_closed_total[60s])"),
]
# None is empty against RabbitMQ 3.10.8 with rabbitmq_prometheus (checked on this machine).
EMPTY_ON_RABBITMQ: set[str] = set()


def expand(expr: str, cluster: str) -> str:
    # "namespace" is a Kubernetes target label; outside Kubernetes it is absent, which
    # PromQL's namespace="" matches
    return expr.replace("$rabbitmq_cluster", cluster).replace("$namespace", "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.2)


@pytest.fixture
def triomq(tmp_path):
    amqp, http = free_port(), free_port()
    log = open(tmp_path / "broker.log", "wb")  # noqa: SIM115 - the broker's lifetime
    proc = subprocess.Popen([sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
                             "--port", str(amqp), "--data-dir", str(tmp_path / "data"),
                             "--http-port", str(http)], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        _wait(lambda: _listening("127.0.0.1", amqp) and _listening("127.0.0.1", http), 60,
              "TrioMQ to listen")
        yield amqp, http
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _traffic(port: int, stop: threading.Event, errors: list) -> None:
    """Publishers with confirms, a manual-ack consumer, an auto-ack consumer, basic.get (with
    and without ack, and empty), unroutable messages and queue churn, until ``stop``."""
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port,
                                                                 heartbeat=0))
        pub = conn.channel()
        pub.confirm_delivery()
        for q in ("dash-manual", "dash-auto", "dash-get", "dash-ready", "dash-empty"):
            pub.queue_declare(q, auto_delete=False)
        cons = conn.channel()
        cons.basic_consume("dash-manual",
                           lambda ch, m, p, b: ch.basic_ack(m.delivery_tag))
        cons.basic_consume("dash-auto", lambda ch, m, p, b: None, auto_ack=True)
        getter = conn.channel()
        n = 0
        while not stop.is_set():
            n += 1
            for q in ("dash-manual", "dash-auto", "dash-get", "dash-get", "dash-ready"):
                pub.basic_publish("", q, b"x" * 100)
            pub.basic_publish("", "no-such-queue", b"dropped")
            method, _props, _body = getter.basic_get("dash-get")
            if method is not None:
                getter.basic_ack(method.delivery_tag)
            getter.basic_get("dash-get", auto_ack=True)
            getter.basic_get("dash-empty")  # get_empty
            churn = conn.channel()
            churn.queue_declare("", exclusive=True)
            churn.close()
            conn.process_data_events(time_limit=0.05)
        conn.close()
    except Exception as exc:  # reported by the test
        errors.append(exc)


def _prometheus(tmp_path: Path, targets: dict[str, str]):
    port = free_port()
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
                   for job, target in targets.items())
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"scrape_configs:\n{jobs}")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - prometheus' lifetime
    proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, port, log


def _query(client: httpx.Client, expr: str) -> list:
    r = client.get("/api/v1/query", params={"query": expr})
    assert r.status_code == 200, (expr, r.text)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.mark.timeout(300)
def test_grafana_overview_dashboard_queries_return_data(triomq, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make system-deps)")
    amqp, http = triomq
    targets = {"triomq": f"127.0.0.1:{http}"}
    rabbit = _listening(*RABBITMQ_METRICS)
    if rabbit:
        targets["rabbitmq"] = "{}:{}".format(*RABBITMQ_METRICS)
    stop, errors = threading.Event(), []
    worker = threading.Thread(target=_traffic, args=(amqp, stop, errors), daemon=True)
    worker.start()
    proc, port, log = _prometheus(tmp_path, targets)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            _wait(lambda: _listening("127.0.0.1", port), 60, "prometheus to listen")

            def ready() -> bool:
                # it listens before its storage is open: queries answer 503 until /-/ready
                try:
                    return client.get("/-/ready").status_code == 200
                except httpx.HTTPError:
                    return False
            _wait(ready, 120, "prometheus to be ready")

            def scraped_enough() -> bool:
                # rate()[60s] needs two samples; a few more so traffic shows in them
                r = _query(client, 'count_over_time(up{job="triomq"}[60s])')
                return bool(r) and float(r[0]["value"][1]) >= 5
            _wait(scraped_enough, 120, "five scrapes of TrioMQ")
            identity = _query(client, 'rabbitmq_identity_info{job="triomq"}')
            assert len(identity) == 1
            cluster = identity[0]["metric"]["rabbitmq_cluster"]
            empty = [expr for expr in DASHBOARD_QUERIES
                     if not _query(client, expand(expr, cluster))]
            assert empty == [], f"{len(empty)} dashboard queries empty on TrioMQ: {empty}"
            if rabbit:
                rcluster = _query(client, 'rabbitmq_identity_info{job="rabbitmq"}')[0][
                    "metric"]["rabbitmq_cluster"]
                rempty = {expr for expr in DASHBOARD_QUERIES
                          if not _query(client, expand(expr, rcluster))}
                # the same dashboard on RabbitMQ, through the same Prometheus
                assert rempty <= EMPTY_ON_RABBITMQ, rempty - EMPTY_ON_RABBITMQ
            # the traffic shows: messages published per second above zero
            rate = _query(client, expand(DASHBOARD_QUERIES[1], cluster))
            assert float(rate[0]["value"][1]) > 0
    finally:
        stop.set()
        worker.join(30)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert not errors, errors


def test_metrics_detailed_families_and_vhost_filter(triomq):
    amqp, http = triomq
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
    try:
        ch = conn.channel()
        ch.queue_declare("detailed-q")
        ch.basic_publish("", "detailed-q", b"hello",
                         pika.BasicProperties(timestamp=1_700_000_000))
        # one message dead-lettered for maxlen (drop-head, at-most-once), one dropped
        # without a dead-letter exchange
        ch.queue_declare("dl-target")
        ch.queue_declare("dl-source", arguments={"x-max-length": 1,
                                                 "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": "dl-target"})
        ch.queue_declare("dl-none", arguments={"x-max-length": 1})
        for q in ("dl-source", "dl-source", "dl-none", "dl-none"):
            ch.basic_publish("", q, b"m")
        base = f"http://127.0.0.1:{http}"

        def get(query: str) -> str:
            r = httpx.get(base + "/metrics/detailed" + query, timeout=10)
            assert r.status_code == 200
            return r.text

        text = _wait(lambda: (t := get("?family=queue_coarse_metrics"))
                     and 'queue="detailed-q"' in t and t, 10, "the queue's series")
        assert 'rabbitmq_detailed_queue_messages_ready{queue="detailed-q",vhost="/"} 1.0' in text
        assert "rabbitmq_detailed_connections_opened_total" not in text
        assert "rabbitmq_identity_info{" in text and "rabbitmq_build_info{" in text
        # no family: only the identity, as rabbitmq_prometheus
        bare = get("")
        assert "rabbitmq_detailed_" not in bare and "rabbitmq_identity_info{" in bare
        churn = get("?family=connection_churn_metrics")
        assert "rabbitmq_detailed_connections_opened_total 1.0" in churn
        assert "rabbitmq_detailed_queue_messages_ready" not in churn
        metrics = get("?family=queue_metrics")
        assert ('rabbitmq_detailed_queue_head_message_timestamp{queue="detailed-q",vhost="/"} '
                "1.7e+09") in metrics
        assert 'rabbitmq_detailed_queue_messages_ready_bytes{queue="detailed-q",vhost="/"} 5.0' \
            in metrics
        per_object = httpx.get(base + "/metrics/per-object", timeout=10).text
        assert ('rabbitmq_queue_head_message_timestamp{queue="detailed-q",vhost="/"} 1.7e+09'
                in per_object)
        channels = get("?family=channel_metrics")
        assert "rabbitmq_detailed_channel_consumers{channel=" in channels
        assert " -> 127.0.0.1:" in channels and " (1)" in channels
        # the vhost filter
        other = get("?family=queue_coarse_metrics&vhost=other")
        assert "detailed-q" not in other
        both = get("?family=queue_coarse_metrics&family=queue_consumer_count&vhost=%2F")
        assert 'rabbitmq_detailed_queue_consumers{queue="detailed-q",vhost="/"} 0.0' in both
        _wait(lambda: ch.basic_get("dl-target", auto_ack=True)[0] is not None, 10,
              "the dead letter")
        ch.basic_get("dl-target", auto_ack=True)  # empty now
        ch.queue_delete("dl-target")  # its counters stay in the totals
        # the aggregated endpoint: identity, churn, fds and disk, labelled global counters
        agg = httpx.get(base + "/metrics", timeout=10).text
        for name in ("rabbitmq_identity_info{", "rabbitmq_build_info{",
                     "rabbitmq_queues_declared_total 4.0", "rabbitmq_queues_created_total 4.0",
                     "rabbitmq_queues_deleted_total 1.0",
                     "rabbitmq_channels_opened_total 1.0", "rabbitmq_process_open_fds ",
                     "rabbitmq_process_max_fds ", "rabbitmq_disk_space_available_bytes ",
                     'rabbitmq_global_messages_received_total{protocol="amqp091"} 5.0',
                     "rabbitmq_global_messages_dead_lettered_maxlen_total{dead_letter_strategy="
                     '"at_most_once",queue_type="rabbit_classic_queue"} 1.0',
                     "rabbitmq_global_messages_dead_lettered_maxlen_total{dead_letter_strategy="
                     '"disabled",queue_type="rabbit_classic_queue"} 1.0',
                     "rabbitmq_channel_consumers 0.0",
                     'rabbitmq_global_publishers{protocol="amqp091"} 1.0',
                     'rabbitmq_global_consumers{protocol="amqp091"} 0.0',
                     'rabbitmq_global_messages_delivered_get_auto_ack_total{protocol="amqp091",'
                     'queue_type="rabbit_classic_queue"} 1.0',
                     'rabbitmq_global_messages_get_empty_total{protocol="amqp091",'
                     'queue_type="rabbit_classic_queue"} 1.0',
                     'rabbitmq_global_messages_delivered_total{protocol="amqp091",'
                     'queue_type="rabbit_quorum_queue"} 0.0'):
            assert name in agg, name
        assert "rabbitmq_global_messages_delivered_get_total" not in agg  # not RabbitMQ's
    finally:
        conn.close()
