"""The web console's browser tests: one TrioMQ subprocess with its HTTP port and one headless
Debian chromium (driven by playwright, never a downloaded browser) for the whole module.

``CONSOLE_SCREENSHOTS=DIR`` makes the tests save screenshots of the main pages into DIR
(docs/console/ is made that way)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from brokerproc import BrokerProc

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    return CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")


@pytest.fixture(scope="module")
def broker_proc(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("console") / "data", store="memory", http=True).start()
    deadline = time.monotonic() + 30
    while True:  # the HTTP listener may come up just after the AMQP one
        try:
            if httpx.get(proc.http_url + "/api/whoami", auth=("guest", "guest"), timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"management API did not answer on {proc.http_url}:\n{proc.log()}", pytrace=False)
        time.sleep(0.1)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, broker_proc):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    pg.on("dialog", lambda dialog: dialog.accept())  # the console confirms deletes and purges
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(broker_proc.http_url + "/")
    yield pg
    context.close()
    assert not errors, f"JavaScript errors in the console: {errors}"


@pytest.fixture
def shot():
    """shot(page, name): a full-page screenshot into $CONSOLE_SCREENSHOTS when set."""
    target = os.environ.get("CONSOLE_SCREENSHOTS")

    def take(pg, name: str) -> None:
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            # a scrolled sticky header lands mid-page; toasts of earlier steps are noise
            pg.evaluate("window.scrollTo(0, 0); document.getElementById('toasts')?.remove()")
            pg.wait_for_timeout(300)  # let charts and tables settle
            pg.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)
    return take
