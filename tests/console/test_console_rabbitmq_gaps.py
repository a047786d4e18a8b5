"""The console's parts RabbitMQ's has and it lacked, in Debian's chromium against a TrioMQ
subprocess: the name a client gives its connection, the version and cluster name in the
header, RabbitMQ's rate series, a rate graph on the queue page, churn and memory panels."""
from __future__ import annotations

import os
import shutil
import time

import pika
import pytest

from .test_console import chart_state, logged_in

pytestmark = pytest.mark.skipif(
    not (os.path.exists("/usr/bin/chromium") or shutil.which("chromium")),
    reason="/usr/bin/chromium is missing (make system-deps installs Debian's chromium)")


def test_connection_name_header_and_panels(page, broker_proc, shot):
    params = pika.ConnectionParameters("127.0.0.1", broker_proc.port,
                                       client_properties={"connection_name": "billing-worker"})
    conn = pika.BlockingConnection(params)
    try:
        logged_in(page)
        # the header: TrioMQ's version, the RabbitMQ version it answers as, the cluster name
        version = page.locator("#product-version")
        assert version.is_visible() and version.inner_text().startswith("TrioMQ ")
        assert "(RabbitMQ 3." in version.inner_text()
        assert page.locator("#cluster-name").inner_text() == "triomq@localhost"

        # the overview: every RabbitMQ rate series, the churn graph, the memory panel
        page.wait_for_selector("#chart-rates canvas")
        labels = page.locator("#chart-rates .legend-item").evaluate_all(
            "els => els.map(e => e.dataset.series)")
        assert labels[:5] == ["Publish", "Publisher confirm", "Deliver (manual ack)",
                              "Deliver (auto ack)", "Consumer ack"]
        assert {"Redelivered", "Get (empty)", "Unroutable (return)",
                "Unroutable (drop)"} <= set(labels)
        page.wait_for_selector("#chart-churn canvas")
        assert page.locator("#chart-churn [data-series='Connections opened']").count() == 1
        page.wait_for_selector("#memory-panel #memory-total")
        assert page.locator("#memory-panel tr[data-part=queue_procs]").count() == 1

        # the connections page: the client's name under the peer address
        page.goto(broker_proc.http_url + "/#/connections")
        page.locator("#connections-table .conn-name", has_text="billing-worker").wait_for()

        # the queue page: a message-rate graph that moves when messages flow
        ch = conn.channel()
        ch.queue_declare("console-rates")
        page.goto(broker_proc.http_url + "/#/queues/%2F/console-rates")
        page.select_option("#refresh-interval", "2")
        page.wait_for_selector(".queue-rates canvas")
        chart_id = page.locator(".queue-rates").get_attribute("id")
        deadline = time.monotonic() + 60
        while True:
            ch.basic_publish("", "console-rates", b"x")
            conn.process_data_events(0)
            _points, latest = chart_state(page, chart_id)
            if latest and (latest[0] or 0) > 0:
                break
            assert time.monotonic() < deadline, f"queue publish rate never moved: {latest}"
            page.wait_for_timeout(300)
        shot(page, "queue-rates")
    finally:
        conn.close()
