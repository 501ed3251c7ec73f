"""The web console (docs/CONSOLE.md) in headless Chromium against a real `topics serve`.

One browser for the module; each test starts its own server process on an ephemeral
port. The first test also takes a screenshot: docs/console.png when
TOPICS_CONSOLE_SCREENSHOT=1 is set, else a file in its temporary directory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"
VIEWPORT = (1440, 900)
KEY = "console-test-secret"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(
            f"no {' or '.join(missing)}: the console test needs Debian's Chromium and its "
            "driver (apt-get install chromium chromium-driver)"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
        "--force-prefers-reduced-motion",  # no row flashes: stable screenshots
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        # The viewport itself, not the window (whose size includes no chrome in headless,
        # but be exact): what the screenshot shows.
        drv.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False},
        )
        yield drv
    finally:
        drv.quit()


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    env = getattr(request, "param", None) or {}
    srv = ServerProcess(tmp_path, env)
    try:
        yield srv
    finally:
        srv.stop()


def wait_until(
    drv: WebDriver, cond: Callable[[WebDriver], Any], what: str, timeout: float = 10
) -> Any:
    return WebDriverWait(drv, timeout, poll_frequency=0.05).until(
        cond, message=f"timed out: {what}"
    )


def css(drv: WebDriver, selector: str) -> list[Any]:
    return drv.find_elements(By.CSS_SELECTOR, selector)


def write(c: httpx.Client, topic: str, *records: dict[str, Any]) -> None:
    r = c.post(f"/v0/topics/{topic}", json={"records": list(records)})
    assert r.status_code in (200, 201), r.text  # 201 when the write created the topic


def put(c: httpx.Client, path: str, body: dict[str, Any]) -> None:
    r = c.put(path, json=body)
    assert r.status_code in (200, 201), r.text


def seed(c: httpx.Client) -> None:
    """A few topics of every kind, a queue with leases and a router: what the picture shows."""
    put(c, "/v0/topics/orders", {"durability": "fsync", "priority": 100})
    put(
        c,
        "/v0/routers/orders->audit",
        {"source": "orders", "dest": "audit.orders", "guarantee": "exactly_once"},
    )
    write(
        c,
        "orders",
        *(
            {"data": {"order": 1000 + i, "sku": f"SKU-{i % 7}", "qty": i % 3 + 1}}
            for i in range(1, 25)
        ),
    )
    put(c, "/v0/topics/billing.jobs", {"type": "queue", "durability": "fsync", "lease_ms": 60000})
    write(
        c,
        "billing.jobs",
        *({"data": {"invoice": 300 + i}, "tag": f"inv:{300 + i}"} for i in range(12)),
    )
    r = c.post("/v0/topics/billing.jobs/claim", json={"node": "worker-1", "max": 3})
    assert r.status_code == 200, r.text
    put(c, "/v0/topics/sensors.lab", {"durability": "memory", "cap_records": 8})
    for i in range(12):
        write(c, "sensors.lab", reading(i))
    put(c, "/v0/topics/sessions", {"durability": "ephemeral", "ttl_ms": 600000})
    write(c, "sessions", *({"data": {"user": f"u{i}", "active": True}} for i in range(5)))


def reading(i: int, node: str = "probe-1") -> dict[str, Any]:
    return {
        "data": {"temp_c": round(21.0 + (i % 5) * 0.4, 1)},
        "tag": "room:lab",
        "node": node,
    }


def js_errors(drv: WebDriver) -> list[str]:
    return [e["message"] for e in drv.get_log("browser") if e.get("source") == "javascript"]


def test_console_topics_live_tail_and_screenshot(
    driver: WebDriver, server: ServerProcess, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    with httpx.Client(base_url=server.base, timeout=10) as c:
        seed(c)
        driver.get(f"{server.base}/?refresh=0.5")
        wait_until(
            driver, lambda d: css(d, 'tr[data-key="orders"]'), "the seeded topics are listed"
        )
        assert not css(driver, "#auth:not([hidden])"), "auth is off: no token box"
        assert not css(driver, 'tr[data-key="web.clicks"]')

        # A topic written over HTTP after the page loaded shows up at the next refresh.
        write(c, "web.clicks", {"data": {"path": "/pricing", "ms": 412}})
        row = wait_until(
            driver, lambda d: css(d, 'tr[data-key="web.clicks"]'), "the new topic's row"
        )[0]
        assert row.find_element(By.CSS_SELECTOR, "th").text == "web.clicks"
        orders = css(driver, 'tr[data-key="orders"] td')
        size = c.get("/v0/topics/orders", params={"touch": "false"}).json()["bytes"]
        assert [td.text for td in orders[:3]] + [orders[4].text] == ["24", "1", "24", "fsync"]
        assert orders[3].get_attribute("title") == f"{size:,} bytes"
        assert "100" in orders[5].text  # the manual priority
        wait_until(
            driver,
            lambda d: (
                [td.text for td in css(d, '#queues-body tr[data-key="billing.jobs"] td')][:2]
                == ["9", "3"]
            ),
            "the queue's ready and leased counts",
        )
        wait_until(
            driver,
            lambda d: "orders → audit.orders" in d.find_element(By.ID, "routers-body").text,
            "router",
        )

        # The live tail, from the beginning of a capped topic: a tombstone for what the cap
        # evicted, then the 8 live records, then a record written now arrives by itself.
        Select(driver.find_element(By.ID, "tail-from")).select_by_value("all")
        driver.find_element(By.CSS_SELECTOR, 'button[aria-label="Tail sensors.lab"]').click()
        wait_until(
            driver,
            lambda d: len(css(d, "#tail-log li.record")) == 8,
            "the retained records in the tail",
        )
        tomb = css(driver, "#tail-log li.tombstone")
        assert len(tomb) == 1 and tomb[0].get_attribute("data-gap-to") == "4", [
            t.text for t in tomb
        ]
        assert "seqs 1–4 gone" in tomb[0].text
        write(
            c,
            "sensors.lab",
            {"data": {"temp_c": 23.9, "door": "open"}, "node": "probe-2"},
        )
        live = wait_until(
            driver, lambda d: css(d, '#tail-log li.record[data-seq="13"]'), "the live record"
        )[0]
        assert '"door":"open"' in live.text and "probe-2" in live.text
        assert "Live: sensors.lab" in driver.find_element(By.ID, "tail-status").text

        # A few seconds of traffic so that the sparklines have a shape, then the picture.
        stop = threading.Event()

        def traffic() -> None:
            i = 0
            while not stop.wait(0.35):
                i += 1
                write(
                    c, "orders", *({"data": {"order": 2000 + i * 10 + k}} for k in range(i % 4 + 1))
                )
                if i % 3 == 0:
                    write(c, "sensors.lab", reading(i, "probe-2"))
                if i % 2 == 0:
                    write(c, "web.clicks", {"data": {"path": f"/docs/{i}", "ms": 90 + i * 7}})

        th = threading.Thread(target=traffic, daemon=True)
        th.start()
        try:
            wait_until(
                driver,
                lambda d: len(css(d, "#tail-log li.record")) >= 12,
                "more live records",
                timeout=15,
            )
            time.sleep(max(0.0, 9.0 - (time.monotonic() - t0)))
            assert driver.find_element(By.CSS_SELECTOR, "#chart-sse .val").text == "1"
            assert driver.find_element(By.CSS_SELECTOR, "#chart-leases .val").text == "3"
            assert not js_errors(driver), js_errors(driver)
            # Focus off the Tail button (no focus ring in the picture), then the picture.
            driver.find_element(By.ID, "tail-log").click()
            # Every run takes the picture; it replaces docs/console.png only when asked
            # (TOPICS_CONSOLE_SCREENSHOT=1), so a test run leaves the checkout as it was.
            shot = (
                SCREENSHOT
                if os.environ.get("TOPICS_CONSOLE_SCREENSHOT") == "1"
                else tmp_path / "console.png"
            )
            assert driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
        finally:
            stop.set()
            th.join(5)


@pytest.mark.parametrize("server", [{"TOPICS_API_KEYS": f"{KEY}:r+w"}], indirect=True)
def test_console_asks_for_a_token_when_auth_is_on(driver: WebDriver, server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.base, timeout=10, headers=auth) as c:
        write(c, "private.events", {"data": {"hello": "world"}})
        driver.get(f"{server.base}/?refresh=0.5")
        box = wait_until(
            driver,
            lambda d: (
                d.find_element(By.ID, "auth").is_displayed() and d.find_element(By.ID, "auth")
            ),
            "the token box",
        )
        assert not driver.find_element(By.ID, "main").is_displayed()
        token = box.find_element(By.ID, "token")

        # A wrong key is refused and the box stays.
        token.send_keys("not-the-key")
        box.find_element(By.ID, "token-submit").click()
        wait_until(
            driver, lambda d: "refused" in d.find_element(By.ID, "auth-error").text, "the refusal"
        )
        assert not css(driver, 'tr[data-key="private.events"]')

        driver.find_element(By.ID, "token").send_keys(KEY)
        driver.find_element(By.ID, "token-submit").click()
        wait_until(
            driver, lambda d: css(d, 'tr[data-key="private.events"]'), "the topics after the key"
        )
        assert not driver.find_element(By.ID, "auth").is_displayed()
        assert driver.find_element(By.ID, "auth-state").text == "API key"
        assert driver.execute_script("return sessionStorage.getItem('topics.console.token')") == KEY

        # The tail's EventSource carries the key as ?token= (it cannot send the header).
        Select(driver.find_element(By.ID, "tail-from")).select_by_value("new")
        driver.find_element(By.CSS_SELECTOR, 'button[aria-label="Tail private.events"]').click()
        wait_until(
            driver,
            lambda d: "Live: private.events" in d.find_element(By.ID, "tail-status").text,
            "live",
        )
        write(c, "private.events", {"data": {"secret": "arrived"}})
        wait_until(
            driver, lambda d: css(d, '#tail-log li.record[data-seq="2"]'), "the record under auth"
        )
        assert len(css(driver, "#tail-log li.record")) == 1  # "new records only"

        # A reload keeps the key (sessionStorage): no box this time.
        driver.refresh()
        wait_until(
            driver, lambda d: css(d, 'tr[data-key="private.events"]'), "the topics after a reload"
        )
        assert not driver.find_element(By.ID, "auth").is_displayed()
