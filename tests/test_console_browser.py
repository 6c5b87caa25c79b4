"""The web console in a real headless Chromium against a real daemon (issue 29): sign in, filter episodes,
recall as a repository, open a briefing, follow a live run log, be refused a forget with the read token
and forget with the control token; screenshots at 1280×800 and at a phone's size.

Debian's `chromium` and `chromium-driver` (`make test-tools` installs them), driven by selenium. The
screenshots are left in the test's tmp directory (`<tmp>/screenshots/`).
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from support_console import API, WEB, XSS, console_daemon, rpc, seed
from support_daemon import Daemon

pytestmark = [pytest.mark.slow, pytest.mark.req19]

#: A hang guard for each wait on the page (polled), not a timing under test.
WAIT = 60


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian's chromium and chromium-driver are needed: make test-tools"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,800", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def _viewport(chrome: webdriver.Chrome, width: int, height: int, *, mobile: bool) -> None:
    chrome.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _sign_in(chrome: webdriver.Chrome, base: str, token: str, tier: str) -> None:
    chrome.get(base + "/login")
    chrome.find_element(By.ID, "token").send_keys(token)
    chrome.find_element(By.ID, "signin").click()
    WebDriverWait(chrome, WAIT).until(ec.text_to_be_present_in_element((By.ID, "tier"), f"{tier} tier"))


def _sign_out(chrome: webdriver.Chrome) -> None:
    chrome.find_element(By.CSS_SELECTOR, "form.signout button").click()
    WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "token")))


def _episode_ids(chrome: webdriver.Chrome) -> set[str]:
    return {row.get_attribute("data-episode") for row in chrome.find_elements(By.CSS_SELECTOR, "#episodes tr[data-episode]")}


def test_issue29_console_in_a_real_browser(tmp_path: Path, browser: webdriver.Chrome) -> None:
    daemon: Daemon = console_daemon(tmp_path, runs=True)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        ids = seed(daemon)
        base = daemon.info["console"].rstrip("/")
        chrome = browser

        # Sign in with the read token; filter the episodes by outcome, then by repository.
        _sign_in(chrome, base, daemon.token("read"), "read")
        assert _episode_ids(chrome) == set(ids.values())
        Select(chrome.find_element(By.ID, "f-outcome")).select_by_value("failed")
        chrome.find_element(By.ID, "filter").click()
        WebDriverWait(chrome, WAIT).until(lambda c: "outcome=failed" in c.current_url)
        assert _episode_ids(chrome) == {ids["api2"]}
        chrome.get(base + "/episodes")
        chrome.find_element(By.ID, "f-repo").send_keys(WEB)
        chrome.find_element(By.ID, "filter").click()
        WebDriverWait(chrome, WAIT).until(lambda c: "repo=" in c.current_url)
        assert _episode_ids(chrome) == {ids["web"]}

        # Screenshots of the list at 1280×800 and at a phone's size (390×844).
        chrome.get(base + "/episodes")
        _viewport(chrome, 1280, 800, mobile=False)
        chrome.save_screenshot(str(shots / "episodes-1280x800.png"))
        assert _png_size(shots / "episodes-1280x800.png") == (1280, 800)
        _viewport(chrome, 390, 844, mobile=True)
        chrome.save_screenshot(str(shots / "episodes-phone.png"))
        assert _png_size(shots / "episodes-phone.png") == (390, 844)
        # Readable on a phone: nothing forces the page wider than the screen.
        assert chrome.execute_script("return document.documentElement.scrollWidth") <= 390
        _viewport(chrome, 1280, 800, mobile=False)

        # The XSS payload an agent wrote is shown as text and never runs.
        chrome.get(f"{base}/episodes/{ids['web']}")
        shown = chrome.find_element(By.ID, "episode-text").text
        assert '<script>document.title="pwned"</script>' in shown
        assert chrome.title != "pwned" and "pwned" not in chrome.title
        assert chrome.find_elements(By.CSS_SELECTOR, "#episode-text img") == []
        assert chrome.find_element(By.CSS_SELECTOR, "#episode-text .untrusted-tag").text.lower() == "agent-written"

        # Recall as the api repository: only its scope comes back.
        chrome.get(base + "/recall")
        chrome.find_element(By.ID, "query").send_keys("ledger rounding")
        chrome.find_element(By.ID, "as-repo").click()
        chrome.find_element(By.ID, "target").send_keys(API)
        chrome.find_element(By.ID, "ask").click()
        answer = WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "answer")))
        assert ids["api"] in answer.text and ids["web"] not in answer.text
        assert chrome.find_element(By.ID, "answer-scope").text.endswith(API)
        assert "pwned" not in chrome.title
        chrome.save_screenshot(str(shots / "recall-1280x800.png"))

        # A briefing, opened from the list.
        chrome.get(base + "/briefings")
        chrome.find_element(By.LINK_TEXT, "api-fixer").click()
        figures = WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "figures")))
        assert "bytes" in figures.text and "provider" in figures.text

        # Forget with the read token: the confirmation says so, and the confirmed post is refused.
        chrome.get(f"{base}/episodes/{ids['api2']}")
        chrome.find_element(By.ID, "forget").click()
        assert chrome.find_element(By.ID, "needs-control").is_displayed()
        chrome.find_element(By.ID, "confirm").click()
        error = WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "error")))
        assert error.get_attribute("data-code") == "PERMISSION_DENIED"
        assert rpc(daemon, "GetEpisode", "read", episode_id=ids["api2"])["forgotten_at"] is None

        # Follow a live run log: the page streams the run's new lines as they come (cancel, end).
        run_id = rpc(daemon, "StartRun", harness="long")["run_id"]
        chrome.get(f"{base}/runs/{run_id}?harness=long")
        log = chrome.find_element(By.ID, "log")
        assert log.get_attribute("data-live") == "yes"
        before = log.text
        rpc(daemon, "CancelRun", run_id=run_id, harness="long")
        WebDriverWait(chrome, WAIT).until(lambda c: "cancel asked" in c.find_element(By.ID, "log").text)
        WebDriverWait(chrome, WAIT).until(
            lambda c: c.find_element(By.ID, "log-state").get_attribute("data-state") == "ended")
        assert "cancel asked" not in before
        assert "cancelled" in chrome.find_element(By.ID, "log-state").text
        chrome.save_screenshot(str(shots / "run-1280x800.png"))

        # Sign in again with the control token: the forget is confirmed and done.
        _sign_out(chrome)
        _sign_in(chrome, base, daemon.token("control"), "control")
        chrome.get(f"{base}/episodes/{ids['api2']}")
        chrome.find_element(By.ID, "forget").click()
        assert chrome.find_elements(By.ID, "needs-control") == []
        chrome.find_element(By.ID, "confirm").click()
        WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "done")))
        assert rpc(daemon, "GetEpisode", "read", episode_id=ids["api2"])["forgotten_at"] is not None
        chrome.get(f"{base}/episodes/{ids['api2']}")
        assert chrome.find_element(By.ID, "forgotten").is_displayed()

        chrome.get(base + "/health")
        assert chrome.find_elements(By.CSS_SELECTOR, "#charts svg")
        chrome.save_screenshot(str(shots / "health-1280x800.png"))
        assert XSS not in chrome.title
    finally:
        daemon.stop()
