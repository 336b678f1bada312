"""Drives Tether's dashboard in headless Chromium (tests/tests/gateway/dashboard.rs runs it).

The page loads with the token; the server SERVER is killed (SIGKILL, its pid read from the admin
API) and the page must show it backing off and then healthy again; the policy is swapped from the
page's form. A screenshot is taken at each step; the browser's console must stay free of errors.
Prints "dashboard ok" when every step passed. The admin token comes in TETHER_ADMIN_TOKEN.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

PATIENCE = 30


def main():
    parser = argparse.ArgumentParser()
    for name in ("--url", "--server", "--policy", "--chromium", "--chromedriver", "--screenshots"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    token = os.environ["TETHER_ADMIN_TOKEN"]

    options = webdriver.ChromeOptions()
    options.binary_location = args.chromium
    # This machine's network is closed: without these, Chromium keeps trying to reach Google.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1100",
        f"--user-data-dir={tempfile.mkdtemp(prefix='tether-chromium-')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
    try:
        run(driver, args, token)
    finally:
        driver.quit()
    print("dashboard ok")


def run(driver, args, token):
    wait = WebDriverWait(driver, PATIENCE, poll_frequency=0.05)
    shot = lambda name: driver.save_screenshot(os.path.join(args.screenshots, f"{name}.png"))
    server = args.server

    def state():
        cells = driver.find_elements(By.CSS_SELECTOR, f'#servers tr[data-server="{server}"] td.state')
        return cells[0].text.strip() if cells else None

    def until(what, condition):
        try:
            wait.until(lambda _: condition())
        except Exception:
            shot("failed")
            raise AssertionError(f"timed out waiting until {what}; the server is {state()!r}")

    driver.get(f"{args.url}#token={token}")
    until("the event stream is live", lambda: driver.find_element(By.ID, "connection").get_attribute("data-live") == "true")
    until(f"{server} is healthy", lambda: state() == "healthy")
    assert "token=" not in driver.current_url, "the token stays in the address bar"
    rows = driver.find_elements(By.CSS_SELECTOR, "#servers tr[data-server]")
    assert len(rows) == 1, f"one row per server, not {len(rows)}"
    shot("1-healthy")

    killed = time.monotonic()
    os.kill(pid_of(args.url, token, server), signal.SIGKILL)
    until(f"{server} is shown backing off", lambda: state() == "backing-off")
    shot("2-backing-off")
    until(f"{server} is healthy again", lambda: state() == "healthy")
    print(f"healthy again {time.monotonic() - killed:.1f} s after the kill")
    # The last minute: the kill and the recovery fill the picture.
    Select(driver.find_element(By.ID, "window")).select_by_value("60")
    timeline = f'#timelines svg[data-server="{server}"]'
    drawn = {s.get_attribute("data-state") for s in driver.find_elements(By.CSS_SELECTOR, f"{timeline} rect.segment")}
    assert {"healthy", "backing-off"} <= drawn, f"the timeline shows {drawn}"
    assert driver.find_elements(By.CSS_SELECTOR, f"{timeline} .attempt"), "no attempt drawn"
    shot("3-healthy-again")

    driver.find_element(By.ID, "swap-file").send_keys(os.path.abspath(args.policy))
    driver.find_element(By.ID, "swap-button").click()
    answer = lambda: driver.find_element(By.ID, "answer")
    until("the swap is answered", lambda: answer().get_attribute("data-ok") in ("true", "false"))
    assert answer().get_attribute("data-ok") == "true", f"the swap failed: {answer().text}"
    until("the page shows the new policy", lambda: driver.find_element(By.ID, "policy-name").text.strip() == "other-test-policy")
    until(f"{server} is still healthy", lambda: state() == "healthy")
    shot("4-swapped")

    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, f"the page logged errors: {json.dumps(errors, indent=1)}"


def pid_of(url, token, server):
    """The server's child process, as the admin API's /status reports it."""
    base = url.rsplit("/ui", 1)[0]
    request = urllib.request.Request(f"{base}/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        status = json.load(answer)
    for row in status["servers"]:
        if row["name"] == server and row.get("pid"):
            return row["pid"]
    sys.exit(f"no pid for {server} in {status}")


if __name__ == "__main__":
    main()
