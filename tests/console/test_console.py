"""The web console in a real browser (Debian's chromium, headless, driven by playwright) against a
TrioMQ subprocess: login and a failed login, a rate graph moving under a pika load, a queue
created, published to, read and deleted through the pages, a policy created and applied."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pika
import pytest
from brokerproc import BrokerProc

pytestmark = pytest.mark.skipif(
    not (os.path.exists("/usr/bin/chromium") or shutil.which("chromium")),
    reason="/usr/bin/chromium is missing (make system-deps installs Debian's chromium)")


def login(page, user="guest", password="guest"):
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("form.login-card button[type=submit]")


def logged_in(page):
    login(page)
    page.wait_for_selector("#whoami")


def test_failed_login_then_login_and_logout(page, shot):
    page.wait_for_selector("form.login-card")
    shot(page, "login")
    login(page, "guest", "not-the-password")
    page.wait_for_selector(".login-error:has-text('Login failed')")
    assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None
    assert page.locator("#whoami").count() == 0

    login(page)
    assert page.locator("#whoami").inner_text() == "guest"
    assert "administrator" in page.locator(".whoami").inner_text()
    assert page.evaluate("sessionStorage.getItem('triomq.auth')") is not None
    # a reload keeps the session (sessionStorage), logout ends it
    page.reload()
    page.wait_for_selector("#whoami")
    page.click("#logout")
    page.wait_for_selector(".login-error:has-text('logged out')")
    assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None


class Load:
    """Publishes with confirms and consumes with acks on two pika connections until stopped."""

    def __init__(self, port: int, queue: str):
        self.port, self.queue = port, queue
        self.stop = threading.Event()
        self.published = self.acked = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True) for f in (self._publish, self._consume)]

    def _conn(self):
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))

    def _guard(self, fn):
        try:
            fn()
        except BaseException as e:  # reported by the test, not lost in the thread
            self.errors.append(e)

    def _publish(self):
        conn = self._conn()
        ch = conn.channel()
        ch.queue_declare(self.queue, durable=False)
        ch.confirm_delivery()
        while not self.stop.is_set():
            for _ in range(20):
                ch.basic_publish("", self.queue, b"x" * 100)
                self.published += 1
            time.sleep(0.02)  # a steady, modest rate: the machine is shared
        conn.close()

    def _consume(self):
        conn = self._conn()
        ch = conn.channel()
        ch.queue_declare(self.queue, durable=False)
        ch.basic_qos(prefetch_count=50)

        def on_message(ch, method, props, body):
            ch.basic_ack(method.delivery_tag)
            self.acked += 1
        ch.basic_consume(self.queue, on_message)
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.2)
        conn.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        assert not self.errors, self.errors


def chart_state(page, chart_id):
    el = page.locator(f"#{chart_id}")
    return int(el.get_attribute("data-points") or 0), json.loads(el.get_attribute("data-latest") or "[]")


def test_rate_graph_moves_while_a_load_runs(page, broker_proc, shot):
    logged_in(page)
    page.select_option("#refresh-interval", "2")
    page.wait_for_selector("#chart-rates canvas")
    points_before, latest = chart_state(page, "chart-rates")
    assert latest[0] == 0  # nothing published yet: publish rate 0

    with Load(broker_proc.port, "console-load") as load:
        deadline = time.monotonic() + 30
        while True:
            points, latest = chart_state(page, "chart-rates")
            # RabbitMQ's series order: publish, confirm, deliver (manual ack), deliver (auto
            # ack), ack, ...
            publish, deliver, ack = latest[0], latest[2], latest[4]
            if publish > 0 and deliver > 0 and ack > 0 and points > points_before:
                break
            assert time.monotonic() < deadline, f"rates never moved: {latest}, {points} points, {load.published} published"
            page.wait_for_timeout(500)
        # the legend shows the same figure the graph draws
        assert page.locator("#chart-rates [data-series=Publish] .legend-value").inner_text() != "0.0/s"
        page.wait_for_function("document.querySelector('#total-connections .stat-value').textContent !== '0'")
        shot(page, "overview")
        page.goto(broker_proc.http_url + "/#/connections")
        page.wait_for_selector("#connections-table tbody tr:not(.empty)")
        assert page.locator("#connections-table tbody tr").count() == 2
        shot(page, "connections")
        page.goto(broker_proc.http_url + "/#/channels")
        page.wait_for_selector("#channels-table tbody tr:not(.empty)")
    assert load.published > 0 and load.acked > 0


def test_queue_policy_publish_get_delete(page, broker_proc, shot):
    base = broker_proc.http_url
    logged_in(page)
    page.goto(base + "/#/queues")
    page.click("#add-queue summary")
    page.fill("#add-queue input[name=name]", "console-q-orders")
    page.click("#add-queue button[type=submit]")
    row = page.locator("#queues-table tbody tr", has_text="console-q-orders")
    row.wait_for()
    for name in ("console-q-b", "console-q-a"):
        page.fill("#add-queue input[name=name]", name)
        page.click("#add-queue button[type=submit]")
        page.locator("#queues-table tbody tr", has_text=name).wait_for()

    # filter (sent to the API as name=...) and sort by name, both directions
    page.fill("#queues-table input.filter", "console-q-")
    page.wait_for_function("document.querySelectorAll('#queues-table tbody tr').length === 3")
    page.click("#queues-table th:has-text('Name')")
    page.wait_for_selector("#queues-table th[aria-sort=ascending]:has-text('Name')")
    names = lambda: page.locator("#queues-table tbody tr td:nth-child(2)").all_inner_texts()
    page.wait_for_function("document.querySelector('#queues-table tbody tr td:nth-child(2)').textContent === 'console-q-a'")
    assert names() == ["console-q-a", "console-q-b", "console-q-orders"]
    page.click("#queues-table th:has-text('Name')")
    page.wait_for_function("document.querySelector('#queues-table tbody tr td:nth-child(2)').textContent === 'console-q-orders'")
    assert names() == ["console-q-orders", "console-q-b", "console-q-a"]
    page.fill("#queues-table input.filter", "orders")
    page.wait_for_function("document.querySelectorAll('#queues-table tbody tr').length === 1")
    shot(page, "queues")

    # a policy that applies to the queue
    page.goto(base + "/#/policies")
    page.click("#add-policy summary")
    page.fill("#add-policy input[name=name]", "console-cap")
    # a pattern that does not compile: the API's 400 reason is shown, nothing is created
    page.fill("#add-policy input[name=pattern]", "^console-(")
    page.click("#add-policy button[type=submit]")
    page.wait_for_selector(".toast-error:has-text('pattern')")
    assert page.locator("#policies-table tbody tr", has_text="console-cap").count() == 0
    page.fill("#add-policy input[name=pattern]", "^console-q-orders$")
    page.select_option("#add-policy select[name=apply-to]", "queues")
    page.click("#add-policy button.link:has-text('max-length')")
    page.locator("#add-policy .kv-row").first.locator(".kv-value").fill("100")
    page.click("#add-policy button[type=submit]")
    page.locator("#policies-table tbody tr", has_text="console-cap").wait_for()
    assert "max-length: 100" in page.locator("#policies-table tbody tr", has_text="console-cap").inner_text()
    shot(page, "policies")

    # the queue page: effective policy, publish, get
    page.goto(base + "/#/queues")
    page.click("#queues-table a:has-text('console-q-orders')")
    page.wait_for_selector("#queue-name:has-text('console-q-orders')")
    page.locator("dl.props", has_text="console-cap").wait_for()
    page.click("#publish-message summary")
    page.fill("#publish-message textarea[name=payload]", "hello from the console")
    page.click("#publish-message button[type=submit]")
    page.wait_for_selector(".toast:has-text('Message published')")
    page.wait_for_function("document.querySelector('#queue-total .stat-value').textContent === '1'", timeout=15_000)
    page.click("#get-messages button[type=submit]")
    page.wait_for_selector("#get-result pre.payload")
    assert page.locator("#get-result pre.payload").inner_text() == "hello from the console"
    assert "(AMQP default)" in page.locator("#get-result").inner_text()
    shot(page, "queue")

    # purge, then delete: back on the list, the queue is gone
    page.click("#purge-queue")
    page.wait_for_selector(".toast:has-text('purged')")
    page.click("#delete-queue")
    page.wait_for_url("**/#/queues")
    page.fill("#queues-table input.filter", "console-q-orders")
    page.wait_for_selector("#queues-table tr.empty")


def test_admin_pages(page, broker_proc, shot):
    base = broker_proc.http_url
    logged_in(page)
    page.goto(base + "/#/vhosts")
    page.click("#add-vhost summary")
    page.fill("#add-vhost input[name=name]", "console-vh")
    page.fill("#add-vhost input[name=description]", "made in the browser")
    page.click("#add-vhost button[type=submit]")
    page.locator("#vhosts-table tbody tr", has_text="console-vh").wait_for()
    assert page.locator("#vhost-select option", has_text="console-vh").count() == 1
    shot(page, "vhosts")

    page.goto(base + "/#/users")
    page.click("#add-user summary")
    page.fill("#add-user input[name=username]", "console-ann")
    page.fill("#add-user input[name=password]", "s3cret")
    page.fill("#add-user input[name=password_confirm]", "s3cret")
    page.fill("#add-user input[name=tags]", "management")
    page.click("#add-user button[type=submit]")
    page.locator("#users-table a", has_text="console-ann").click()
    page.select_option("#set-permission select[name=vhost]", "console-vh")
    page.fill("#set-permission input[name=write]", "^ann-.*")
    page.click("#set-permission button[type=submit]")
    page.locator("#permissions-table tbody tr", has_text="console-vh").wait_for()
    assert "^ann-.*" in page.locator("#permissions-table").inner_text()
    shot(page, "user")
    page.goto(base + "/#/users")
    page.locator("#users-table tbody tr", has_text="console-ann").wait_for()
    shot(page, "users")

    page.goto(base + "/#/limits")
    page.click("#set-vhost-limits summary")
    page.select_option("#set-vhost-limits select[name=vhost]", "console-vh")
    page.select_option("#set-vhost-limits select[name=limit]", "max-queues")
    page.fill("#set-vhost-limits input[name=value]", "5")
    page.click("#set-vhost-limits button[type=submit]")
    page.locator("#vhost-limits-table tbody tr", has_text="console-vh").wait_for()
    page.click("#set-user-limits summary")
    page.select_option("#set-user-limits select[name=user]", "console-ann")
    page.select_option("#set-user-limits select[name=limit]", "max-channels")
    page.fill("#set-user-limits input[name=value]", "3")
    page.click("#set-user-limits button[type=submit]")
    page.locator("#user-limits-table tbody tr", has_text="console-ann").wait_for()
    auth = ("guest", "guest")
    assert httpx.get(f"{base}/api/vhost-limits/console-vh", auth=auth).json()[0]["value"] == {"max-queues": 5}
    assert httpx.get(f"{base}/api/user-limits/console-ann", auth=auth).json()[0]["value"] == {"max-channels": 3}
    shot(page, "limits")

    # a user without a management tag is refused, as by RabbitMQ's UI
    httpx.put(f"{base}/api/users/console-notag", auth=auth, json={"password": "pw", "tags": ""}).raise_for_status()
    page.click("#logout")
    login(page, "console-notag", "pw")
    page.wait_for_selector(".login-error:has-text('Not a management user')")
    assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None

    # the new user logs in and sees the console without the admin tab
    page.reload()
    login(page, "console-ann", "s3cret")
    page.wait_for_selector("#whoami:has-text('console-ann')")
    assert page.locator(".tabs a[data-tab=admin]").count() == 0


def test_definitions_download_and_upload(page, broker_proc):
    base = broker_proc.http_url
    logged_in(page)
    page.wait_for_selector("#definitions")
    with page.expect_download() as download:
        page.click("#export-definitions")
    defs = json.loads(Path(download.value.path()).read_text())
    assert {"users", "vhosts", "permissions", "queues", "exchanges", "bindings"} <= defs.keys()
    assert any(u["name"] == "guest" for u in defs["users"])

    # a file that is not JSON: a clear error, nothing sent
    page.set_input_files("#definitions-file", files=[{"name": "broken.json", "mimeType": "application/json", "buffer": b"{not json"}])
    page.click("#import-definitions")
    page.wait_for_selector(".toast-error:has-text('broken.json is not valid JSON')")

    upload = {"vhosts": [{"name": "console-imported-vh"}],
              "queues": [{"name": "console-imported", "vhost": "console-imported-vh", "durable": True,
                          "auto_delete": False, "arguments": {}}]}
    page.set_input_files("#definitions-file", files=[{"name": "defs.json", "mimeType": "application/json",
                                                      "buffer": json.dumps(upload).encode()}])
    page.click("#import-definitions")
    page.wait_for_selector("#definitions-result:has-text('Imported defs.json')")
    r = httpx.get(f"{base}/api/queues/console-imported-vh/console-imported", auth=("guest", "guest"))
    assert r.status_code == 200, r.text
    # the new vhost is offered in the header at once
    assert page.locator("#vhost-select option", has_text="console-imported-vh").count() == 1


def test_exchange_page_bind_publish_unbind_and_vhost_scope(page, broker_proc):
    base = broker_proc.http_url
    auth = ("guest", "guest")
    httpx.put(f"{base}/api/vhosts/console-x-vh", auth=auth, json={}).raise_for_status()
    httpx.put(f"{base}/api/queues/%2F/console-x-q", auth=auth, json={"durable": False}).raise_for_status()
    logged_in(page)
    page.goto(base + "/#/exchanges")
    page.click("#add-exchange summary")
    page.fill("#add-exchange input[name=name]", "console-x")
    page.select_option("#add-exchange select[name=type]", "topic")
    page.click("#add-exchange button[type=submit]")
    page.locator("#exchanges-table a", has_text="console-x").click()
    page.wait_for_selector("h1:has-text('console-x')")

    page.click("#add-binding summary")
    page.fill("#add-binding input[name=destination]", "console-x-q")
    page.fill("#add-binding input[name=routing_key]", "orders.*")
    page.click("#add-binding button[type=submit]")
    page.locator("#bindings-table tbody tr", has_text="orders.*").wait_for()

    page.click("#publish-message summary")
    page.fill("#publish-message input[name=routing_key]", "orders.new")
    page.fill("#publish-message textarea[name=payload]", "routed")
    page.click("#publish-message button[type=submit]")
    page.wait_for_selector(".toast-ok:has-text('Message published')")
    q = httpx.get(f"{base}/api/queues/%2F/console-x-q", auth=auth).json()
    assert q["messages"] == 1

    page.locator("#bindings-table tbody tr", has_text="orders.*").locator("button:has-text('Unbind')").click()
    page.wait_for_selector("#bindings-table tr.empty")
    page.click("#publish-message button[type=submit]")
    page.wait_for_selector(".toast-warn:has-text('not routed')")

    # names with odd characters travel percent-encoded, in the API's paths and the console's links
    odd = "console odd/ü#1"
    httpx.put(f"{base}/api/queues/%2F/{quote(odd, safe='')}", auth=auth, json={"durable": False}).raise_for_status()
    page.goto(base + "/#/queues")
    page.locator("#queues-table a", has_text=odd).click()
    page.wait_for_selector("#queue-name")
    assert page.locator("#queue-name").inner_text() == odd
    page.click("#delete-queue")
    page.wait_for_url("**/#/queues")
    assert httpx.get(f"{base}/api/queues/%2F/{quote(odd, safe='')}", auth=auth).status_code == 404

    # the header's vhost selector scopes the lists to one vhost
    page.goto(base + "/#/queues")
    page.select_option("#vhost-select", "console-x-vh")
    page.wait_for_selector("#queues-table tr.empty")
    page.select_option("#vhost-select", "")
    page.locator("#queues-table tbody tr", has_text="console-x-q").wait_for()

    # a queue deleted behind the page's back: the page says so (no error every refresh)
    page.goto(base + "/#/queues/%2F/console-x-q")
    page.wait_for_selector("#queue-name")
    page.select_option("#refresh-interval", "2")
    httpx.delete(f"{base}/api/queues/%2F/console-x-q", auth=auth).raise_for_status()
    page.wait_for_selector(".gone:has-text('This queue was deleted')")
    page.wait_for_timeout(2500)
    assert page.locator(".toast-error").count() == 0

    page.goto(base + "/#/exchanges/%2F/console-x")
    page.click("#delete-exchange")
    page.wait_for_url("**/#/exchanges")
    assert httpx.get(f"{base}/api/exchanges/%2F/console-x", auth=auth).status_code == 404


def test_connection_page_and_force_close(page, broker_proc):
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker_proc.port, heartbeat=0, client_properties={"connection_name": "console-victim"}))
    try:
        conn.channel()
        conn.channel()
        logged_in(page)
        page.goto(broker_proc.http_url + "/#/connections")
        page.locator("#connections-table tbody tr", has_text="Pika").first.wait_for()
        page.locator("#connections-table tbody tr a").first.click()
        page.wait_for_selector("#close-connection")
        assert "console-victim" in page.locator(".page").inner_text()
        page.wait_for_function("document.querySelectorAll('#connection-channels-table tbody tr:not(.empty)').length === 2")
        page.fill("input[name=reason]", "console test says bye")
        page.click("#close-connection")
        page.wait_for_url("**/#/connections")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):
                conn.process_data_events(time_limit=0.1)
        assert closed.value.reply_code == 320
        assert "console test says bye" in closed.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_queue_table_pages_through_the_api(page, broker_proc):
    base = broker_proc.http_url
    auth = ("guest", "guest")
    with httpx.Client(base_url=base, auth=auth) as api:
        for i in range(25):
            api.put(f"/api/queues/%2F/console-page-{i:02d}", json={"durable": False}).raise_for_status()
    seen = []
    page.on("request", lambda r: seen.append(r.url) if "/api/queues?" in r.url else None)
    logged_in(page)
    page.goto(base + "/#/queues")
    page.select_option("#queues-table select.page-size", "20")
    page.fill("#queues-table input.filter", "^console-page-1")
    page.check("#queues-table .table-tools input[type=checkbox]")
    page.wait_for_selector("#queues-table .table-info:has-text('10 of')")
    page.fill("#queues-table input.filter", "console-page-")
    page.uncheck("#queues-table .table-tools input[type=checkbox]")
    page.wait_for_selector("#queues-table .pager:has-text('Page 1 of 2')")
    assert page.locator("#queues-table tbody tr").count() == 20
    page.click("#queues-table button[aria-label='Next page']")
    page.wait_for_selector("#queues-table .pager:has-text('Page 2 of 2')")
    assert page.locator("#queues-table tbody tr").count() == 5
    # the table asked the API for one page, filtered and sorted there
    last = seen[-1]
    assert "page=2" in last and "page_size=20" in last and "name=console-page-" in last, last
    assert any("use_regex=true" in u for u in seen)


def _console_refreshing(context, proc):
    """A logged-in console page of ``proc`` refreshing every 2 s."""
    page = context.new_page()
    page.set_default_timeout(10_000)
    for _ in range(100):  # the HTTP listener may come up just after the AMQP one
        try:
            if httpx.get(proc.http_url + "/api/whoami", auth=("guest", "guest")).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    page.goto(proc.http_url + "/")
    logged_in(page)
    page.select_option("#refresh-interval", "2")
    return page


def test_broker_gone_shows_one_banner(browser, tmp_path):
    proc = BrokerProc(tmp_path / "data", store="memory", http=True).start()
    context = browser.new_context()
    try:
        page = _console_refreshing(context, proc)
        proc.stop()
        page.wait_for_selector("#offline:has-text('not reachable')")
        page.wait_for_timeout(2500)
        assert page.locator("#offline").count() == 1
        assert page.locator(".toast-error").count() == 0
    finally:
        context.close()
        proc.stop()


def test_a_response_cut_off_after_its_headers_is_unreachable_not_an_error(browser, tmp_path):
    """A broker stopping mid-response: the status line and headers came, the body never
    did. That is the broker being unreachable (the banner), not a failed request (a toast)."""
    import socket

    cut = socket.socket()
    cut.bind(("127.0.0.1", 0))
    cut.listen(8)
    port = cut.getsockname()[1]
    stop = threading.Event()

    def serve_cut_off():
        cut.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = cut.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\nAccess-Control-Allow-Origin: *\r\n\r\n{\"x\":")

    server = threading.Thread(target=serve_cut_off, daemon=True)
    server.start()
    proc = BrokerProc(tmp_path / "data", store="memory", http=True).start()
    context = browser.new_context()
    try:
        page = _console_refreshing(context, proc)
        page.route("**/api/overview*", lambda route: route.continue_(
            url=f"http://127.0.0.1:{port}/api/overview"))
        page.wait_for_selector("#offline:has-text('not reachable')")
        assert page.locator(".toast-error").count() == 0
    finally:
        context.close()
        proc.stop()
        stop.set()
        server.join(5)
        cut.close()


def test_quorum_queue_from_the_form(page, broker_proc):
    """Type "Quorum" fixes durability and auto-delete (the broker would refuse others);
    the queue's page shows its type and members, and a policy can apply to quorum queues."""
    base = broker_proc.http_url
    logged_in(page)
    page.goto(base + "/#/queues")
    page.click("#add-queue summary")
    page.select_option("#add-queue select[name=durable]", "false")
    page.select_option("#add-queue select[name=type]", "quorum")
    assert page.locator("#add-queue select[name=durable]").is_disabled()
    assert page.locator("#add-queue select[name=durable]").input_value() == "true"
    page.fill("#add-queue input[name=name]", "console-qq")
    page.click("#add-queue button[type=submit]")
    page.locator("#queues-table tbody tr", has_text="console-qq").wait_for()
    page.click("#queues-table a:has-text('console-qq')")
    page.wait_for_selector("#queue-name:has-text('console-qq')")
    props = page.locator("dl.props", has_text="Members")
    props.wait_for()
    assert "quorum" in props.inner_text()
    page.goto(base + "/#/policies")
    page.click("#add-policy summary")
    page.fill("#add-policy input[name=name]", "console-qq-cap")
    page.fill("#add-policy input[name=pattern]", "^console-qq$")
    page.select_option("#add-policy select[name=apply-to]", "quorum_queues")
    page.click("#add-policy button.link:has-text('delivery-limit')")
    page.locator("#add-policy .kv-row").first.locator(".kv-value").fill("3")
    page.click("#add-policy button[type=submit]")
    page.locator("#policies-table tbody tr", has_text="console-qq-cap").wait_for()
    r = httpx.get(f"{base}/api/queues/%2F/console-qq", auth=("guest", "guest"))
    assert r.json()["policy"] == "console-qq-cap" and r.json()["type"] == "quorum"
