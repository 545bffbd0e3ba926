"""Screenshots of the console's operator pages for the docs (docs/images/console-*.png).

Run from the repository root (needs Debian's chromium and chromium-driver)::

    .venv/bin/python tests/web/shots.py [OUT_DIR]   # default: docs/images

It starts an embedded Valkey (or uses ``$BATCHQ_REDIS_URL``), a worker process of this
module's app and a console with a token, builds a realistic scene (an SMS queue with
eight customers and their limits, three campaigns: one finished, one running, one
cancelled from the console; holds by an operator and by ``RateLimited``; a dead job),
takes its actions through the console's API as user ``alice`` (so the audit log has
real entries) and photographs each page in headless Chromium.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import batchq
from batchq.flow import limits

NS = "acme"
CHROMIUM = os.environ.get("BATCHQ_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BATCHQ_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
TOKEN = "shots-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


def build(url: str | None) -> batchq.App:
    app = batchq.App(url, namespace=NS)

    @app.task(queue="sms", max_attempts=2)
    def send_sms(customer: str, to: str) -> None:
        if to.endswith("13"):
            raise RuntimeError(f"carrier refused {to}: number not reachable")
        time.sleep(0.4)

    @app.task(queue="email")
    def send_email(customer: str, to: str) -> None:
        time.sleep(0.01)

    return app


if __name__ != "__main__":  # the worker process imports ``shots:app``
    app = build(os.environ.get("BATCHQ_REDIS_URL"))


def scene(app: batchq.App) -> None:
    sms = app.queue("sms")
    sms.limit(rate_per_s=500)
    sms.limit("*", rate_per_s=50, concurrency=4)
    sms.limit("cust01", rate_per_s=220, burst=20, concurrency=6, weight=2)
    sms.limit("cust02", rate_per_s=30, concurrency=2)
    sms.limit("cust03", rate_per_s=120, max_pending=5000)
    sms.limit("cust04", concurrency=3, weight=0.5)
    send_sms, send_email = app.tasks["send_sms"], app.tasks["send_email"]
    with app.campaign("welcome-series") as c:
        send_email.options(campaign=c).enqueue_many(
            [(f"cust0{i % 8 + 1}", f"user{i}@example.com") for i in range(120)])
    with app.campaign("spring-sale") as c:
        for i in range(1, 9):
            send_sms.options(group=f"cust0{i}", campaign=c).enqueue_many(
                [(f"cust0{i}", f"+1555{i}{n:04d}") for n in range(90 + 15 * i)])
    with app.campaign("flash-promo") as c:
        for i in (3, 5):
            send_sms.options(group=f"cust0{i}", campaign=c).enqueue_many(
                [(f"cust0{i}", f"+1666{i}{n:04d}") for n in range(200)])
    # a RateLimited hold, as a handler would leave it
    limits.hold(app.clients.sync_scripts, app.keys("sms"), 300, "cust06",
                why=limits.HOLD_RATE_LIMITED)


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from batchq.dev.server import EmbeddedServer
    from batchq.web import start_in_thread

    server = None
    url = os.environ.get("BATCHQ_REDIS_URL")
    if not url:
        server = EmbeddedServer()
        server.start()
        url = server.url
    the_app = build(url)
    the_app.redis.flushdb()
    scene(the_app)
    env = {**os.environ, "BATCHQ_REDIS_URL": url, "BATCHQ_NAMESPACE": NS,
           "PYTHONPATH": str(ROOT / "tests" / "web")}
    worker = subprocess.Popen([sys.executable, "-m", "batchq", "worker", "shots:app",
                               "-c", "24", "--log-level", "WARNING"], cwd=ROOT, env=env)
    web = start_in_thread(the_app, port=0, token=TOKEN)
    alice = {"Authorization": "Basic " + base64.b64encode(f"alice:{TOKEN}".encode()).decode()}

    def act(path: str, body: dict[str, Any]) -> None:
        with urllib.request.urlopen(urllib.request.Request(web.url, headers=alice)) as r:
            page = r.read().decode()
        csrf = page.split('name="batchq-csrf" content="', 1)[1].split('"', 1)[0]
        req = urllib.request.Request(web.url + path, json.dumps(body).encode(), method="POST",
                                     headers={**alice, "X-CSRF-Token": csrf,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            assert r.status == 200, (path, r.read())

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,900", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        time.sleep(4)  # the worker makes progress
        act("api/campaign/cancel", {"id": "flash-promo", "confirmed": True})
        act("api/limit/set", {"queue": "sms", "group": "cust07", "rate_per_s": 80,
                              "concurrency": 2})
        act("api/hold", {"queue": "sms", "group": "cust05", "seconds": 1800})
        act("api/hold", {"queue": "email", "seconds": 30})
        act("api/release", {"queue": "email"})
        subprocess.run([sys.executable, "-m", "batchq", "limit", "set", "shots:app", "sms",
                        "--group", "cust08", "--rate", "40", "--concurrency", "4"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        time.sleep(3)
        driver.get(web.url + "login")
        driver.find_element(By.ID, "token").send_keys(TOKEN)
        driver.find_element(By.ID, "login-submit").click()
        wait = WebDriverWait(driver, 15)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr[data-queue]")))

        def shot(path: str, ready: str, name: str, height: int = 760) -> None:
            driver.set_window_size(1360, height)
            driver.get(web.url + path)
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ready)))
            time.sleep(0.5)
            assert driver.save_screenshot(str(out / f"console-{name}.png"))
            print("wrote", out / f"console-{name}.png")

        shot("", 'tr[data-queue="sms"]', "queues", 520)
        shot("campaigns", 'tr[data-campaign="spring-sale"]', "campaigns", 440)
        shot("campaign?id=spring-sale", 'section[data-queue="sms"] tr[data-group]',
             "campaign", 900)
        shot("groups?queue=sms", 'tr[data-group="cust05"]', "groups", 900)
        deadline = time.monotonic() + 30
        while len(dead := the_app.queue("sms").dead_ids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        act("api/job/retry", {"id": dead[0]})
        act("api/job/cancel", {"id": dead[-1]})  # refused: a dead job is not waiting
        shot(f"job?id={dead[-1]}", "#job-last-error", "job", 880)
        shot("audit", "tr[data-entry]", "audit", 640)
    finally:
        driver.quit()
        web.stop()
        worker.terminate()
        worker.wait(20)
        the_app.close()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
