"""Makes docs/console/*.png: a TrioMQ subprocess with a few users, vhosts, policies, queues and
exchanges, a varying pika load for a few minutes (so the overview's graphs have a shape), then
a headless chromium screenshot of each main page.

    .venv/bin/python -m tests.console.make_screenshots [--minutes 3] [--out docs/console]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "interop-tests"))
from brokerproc import REPO_ROOT, BrokerProc

from .conftest import CHROMIUM_ARGS, chromium_path

QUEUES = [("orders", "/", {}), ("orders.dlq", "/", {}), ("invoices", "/", {"x-max-length": 10000}),
          ("emails", "/", {"x-message-ttl": 60000}), ("audit", "production", {}),
          ("reports", "production", {"x-max-priority": 10})]


def setup(api: httpx.Client) -> None:
    for vhost in ("production", "staging"):
        api.put(f"/api/vhosts/{vhost}", json={"description": f"{vhost} services", "tags": vhost}).raise_for_status()
    for user, tags in (("ops", "administrator"), ("grafana", "monitoring"), ("billing", "management")):
        api.put(f"/api/users/{user}", json={"password": "secret", "tags": tags}).raise_for_status()
    for vhost, user, write in (("/", "billing", "^(orders|invoices).*"), ("production", "ops", ".*"),
                               ("/", "ops", ".*"), ("staging", "billing", ".*")):
        api.put(f"/api/permissions/{'%2F' if vhost == '/' else vhost}/{user}",
                json={"configure": ".*", "write": write, "read": ".*"}).raise_for_status()
    api.put("/api/policies/%2F/dead-letters", json={"pattern": "^orders$", "apply-to": "queues", "priority": 1,
            "definition": {"dead-letter-exchange": "", "dead-letter-routing-key": "orders.dlq"}}).raise_for_status()
    api.put("/api/policies/%2F/ttl", json={"pattern": "^emails", "apply-to": "queues", "priority": 0,
            "definition": {"message-ttl": 120000, "max-length": 50000}}).raise_for_status()
    api.put("/api/operator-policies/production/cap", json={"pattern": ".*", "apply-to": "queues", "priority": 0,
            "definition": {"max-length-bytes": 1073741824}}).raise_for_status()
    for name, vhost, args in QUEUES:
        v = "%2F" if vhost == "/" else vhost
        api.put(f"/api/queues/{v}/{name}", json={"durable": True, "arguments": args}).raise_for_status()
    api.put("/api/vhost-limits/production/max-connections", json={"value": 500}).raise_for_status()
    api.put("/api/vhost-limits/staging/max-queues", json={"value": 200}).raise_for_status()
    api.put("/api/user-limits/billing/max-channels", json={"value": 20}).raise_for_status()
    api.put("/api/exchanges/%2F/events", json={"type": "topic", "durable": True}).raise_for_status()
    api.post("/api/bindings/%2F/e/events/q/orders", json={"routing_key": "order.*"}).raise_for_status()
    api.post("/api/bindings/%2F/e/events/q/invoices", json={"routing_key": "invoice.#"}).raise_for_status()


def load(port: int, stop: threading.Event) -> None:
    """A publisher whose rate swings over minutes and a consumer that lags behind it."""
    def publish():
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        t0 = time.monotonic()
        while not stop.is_set():
            phase = (time.monotonic() - t0) / 60
            n = int(8 + 6 * math.sin(phase * 2.2))
            for _ in range(n):
                ch.basic_publish("events", "order.created", b'{"id": 1, "total": 42.5}',
                                 pika.BasicProperties(content_type="application/json", delivery_mode=2))
            time.sleep(0.1)
        conn.close()

    def consume():
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)

        def on_message(ch, method, props, body):
            time.sleep(0.012)
            ch.basic_ack(method.delivery_tag)
        ch.basic_consume("orders", on_message)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.2)
        conn.close()

    threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "console"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProc(Path(tmp) / "data", store="memory", http=True).start()
        try:
            time.sleep(1)
            api = httpx.Client(base_url=broker.http_url, auth=("guest", "guest"))
            setup(api)
            stop = threading.Event()
            runner = threading.Thread(target=load, args=(broker.port, stop))
            runner.start()
            time.sleep(args.minutes * 60)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(broker.http_url + "/")
                page.wait_for_selector("form.login-card")
                page.screenshot(path=str(out / "login.png"))
                page.fill("input[name=username]", "guest")
                page.fill("input[name=password]", "guest")
                page.click("form.login-card button[type=submit]")
                page.wait_for_selector("#whoami")
                pages = [("overview", "#/"), ("queues", "#/queues"), ("exchanges", "#/exchanges"),
                         ("connections", "#/connections"), ("channels", "#/channels"), ("users", "#/users"),
                         ("user", "#/users/billing"), ("vhosts", "#/vhosts"), ("policies", "#/policies"),
                         ("limits", "#/limits"), ("queue", "#/queues/%2F/orders")]
                name = api.get("/api/connections").json()[0]["name"]
                pages.insert(4, ("connection", "#/connections/" + quote(name, safe="")))
                for name, hash_ in pages:
                    page.goto(broker.http_url + "/" + hash_)
                    page.wait_for_load_state("networkidle")
                    page.wait_for_timeout(1200)
                    if name == "queue":
                        # the queue's graph has no history from the API: watch it for a while
                        page.select_option("#chart-span", "60")
                        page.select_option("#refresh-interval", "2")
                        page.wait_for_timeout(45_000)
                        page.click("#get-messages button[type=submit]")
                        page.wait_for_selector("#get-result .message")
                        page.evaluate("document.getElementById('toasts')?.remove(); window.scrollTo(0, 0)")
                    page.screenshot(path=str(out / f"{name}.png"), full_page=name in ("queue", "policies", "user", "connection"))
                browser.close()
            stop.set()
            runner.join()
        finally:
            broker.stop()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
