"""The web console in a real headless Chromium against a real daemon: sign in, filter episodes,
recall as a repository, open a briefing, follow a live run log, be refused a forget with the read token
and forget with the control token; screenshots at 1280×800 and at a phone's size.

Debian's `chromium` and `chromium-driver` (`make test-tools` installs them), driven by selenium. The
screenshots are left in the test's tmp directory (`<tmp>/screenshots/`).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from fix_daemon import Daemon
from support_console import API, WEB, XSS, console_daemon, rpc, seed
from support_runs import make_history

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


def test_console_in_a_real_browser(tmp_path: Path, browser: webdriver.Chrome) -> None:
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
        recalled = {a.get_attribute("data-episode") for a in answer.find_elements(By.CSS_SELECTOR, "article.item")}
        assert ids["api"] in recalled and ids["web"] not in recalled
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
        # The run is counted: started, ended cancelled, its duration observed; no run id in a label.
        exposition = httpx2.get(daemon.info["metrics"]).text
        assert 'harness_memory_runs_started_total{harness="long"} 1.0' in exposition
        assert 'harness_memory_runs_ended_total{harness="long",outcome="cancelled"} 1.0' in exposition
        assert 'harness_memory_run_duration_seconds_count{harness="long"} 1.0' in exposition
        assert run_id not in exposition
    finally:
        daemon.stop()


#: What no page may show people: raw Python values, raw field keys and byte counts, spec references. (A
#: configuration key as the user writes it, `memory_briefing = true`, is what it is.)
RAW_VALUES = [r"\bTrue\b", r"\bFalse\b", r"\bNone\b", r"free_bytes", r"\bmemory_briefing\b(?! = )", r"\bREQ-\d+",
              r"\bduration_ms\b", r"\bcost_usd\b", r"\b\d{10,}\b", r"\{'", r"\[\]"]


def _raw_values(text: str) -> list[str]:
    return [pattern for pattern in RAW_VALUES if re.search(pattern, text)]


def test_the_memory_browser_reads_an_imported_history_for_people(tmp_path: Path, browser: webdriver.Chrome) -> None:
    """Black-box: a real daemon with a real git history imported through the CLI and a few run
    records (one an XSS payload); the console in headless Chromium. The episode list shows what each run
    said; the search box runs the agents' recall and finds a commit by the words of its message body; a
    recall item links to its episode, whose card lists its files and the later commit that touched them;
    the timeline groups by day and repository; no page shows a raw Python value; the payload stays text."""
    daemon: Daemon = console_daemon(tmp_path)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        ids = seed(daemon)
        repo = make_history(tmp_path / "history")
        imported = subprocess.run([sys.executable, "-m", "memactors.cli", "import", "git", "--repo", str(repo),
                                   "--json"], env=daemon.env, capture_output=True, text=True, timeout=300, check=False)
        assert imported.returncode == 0, imported.stderr
        exposition = httpx2.get(daemon.info["metrics"]).text  # the five commits, counted by source and outcome
        counted = sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
                      if line.startswith("harness_memory_imported_records_total{") and 'source="git"' in line)
        assert counted == 5, exposition
        # Two installs, as `memactors install` mints them: one that recorded a session, one that never did.
        for agent in ("claude-code", "codex"):
            rpc(daemon, "MintRunToken", harness="api-fixer", run_id=f"resident-{agent}-project-0123abcd",
                workdir=str(tmp_path / "history"), ttl_seconds=3600)
        base = daemon.info["console"].rstrip("/")
        chrome = browser
        _sign_in(chrome, base, daemon.token("read"), "read")

        # The list: each episode's own words, newest run first, the payload as text.
        table = chrome.find_element(By.ID, "episodes")
        assert "fixed the ledger rounding in the api" in table.text
        assert "Stream invoice exports to the CSV writer" in table.text
        assert "pwned" not in chrome.title and chrome.find_elements(By.CSS_SELECTOR, "#episodes img") == []
        started = [t.get_attribute("datetime") for t in chrome.find_elements(By.CSS_SELECTOR, "#episodes td.when time")]
        assert started == sorted(started, reverse=True) and len(started) == len(ids) + 5
        chrome.save_screenshot(str(shots / "episodes.png"))

        # The search box: the agents' recall, as the repository; a commit found by its body's words.
        chrome.find_element(By.ID, "search").send_keys("float lost a cent")
        target = chrome.find_element(By.ID, "search-target")
        target.clear()
        target.send_keys(API)
        chrome.find_element(By.ID, "search-go").click()
        answer = WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "answer")))
        assert "Round ledger totals with Decimal quantize" in answer.text, answer.text
        chrome.execute_script("arguments[0].scrollIntoView()", answer)
        chrome.save_screenshot(str(shots / "search.png"))
        link = next(a for a in chrome.find_elements(By.CSS_SELECTOR, "#answer article.item a.episode-link")
                    if "quantize" in a.find_element(By.XPATH, "./ancestor::article").text)
        link.click()

        # The episode card: what was done, its files, the later commit that touched the same file.
        WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "episode-card")))
        assert "Round ledger totals with Decimal quantize" in chrome.find_element(By.ID, "episode-gist").text
        assert {"ledger.py", "test_ledger.py"} <= set(chrome.find_element(By.ID, "episode-files").text.split())
        assert "No later run touched them yet" in chrome.find_element(By.ID, "later").text  # the newest commit on ledger.py
        assert chrome.find_element(By.ID, "run-link").get_attribute("href").startswith(base + "/runs/")
        chrome.save_screenshot(str(shots / "episode.png"))
        chrome.back()
        chrome.back()
        WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "episodes")))
        first = next(a for a in chrome.find_elements(By.CSS_SELECTOR, "#episodes td.gist a")
                     if "Add the ledger with float amounts" in a.text)
        first.click()
        later = WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "later")))
        assert "Round ledger totals with Decimal quantize" in later.text

        # The timeline: grouped by day, then repository.
        chrome.get(base + "/timeline?days=365")
        days = chrome.find_elements(By.CSS_SELECTOR, "#timeline section.day")
        assert [d.get_attribute("data-day") for d in days] == sorted({d.get_attribute("data-day") for d in days},
                                                                      reverse=True)
        assert any(API in h.text for h in chrome.find_elements(By.CSS_SELECTOR, "#timeline h3.repo"))
        assert "Pin the webhook retry clock" in chrome.find_element(By.ID, "timeline").text
        chrome.save_screenshot(str(shots / "timeline.png"))

        # No raw value on any page (the briefing item links to its episode too).
        chrome.get(base + "/briefings/api-fixer")
        links = chrome.find_elements(By.CSS_SELECTOR, "article.item a.episode-link")
        assert links and all("/episodes/" in a.get_attribute("href") for a in links)
        links[0].click()  # a briefing's item names its run: the link finds that run's episode
        WebDriverWait(chrome, WAIT).until(ec.presence_of_element_located((By.ID, "episode-card")))
        assert "/episodes/ep_" in chrome.current_url
        pages = ["/episodes", "/timeline", f"/episodes/{ids['web']}", f"/episodes/{ids['api2']}", "/briefings",
                 "/briefings/api-fixer", "/runs", "/health", "/health/check-provider", "/recall",
                 f"/episodes/{ids['api']}/forget"]
        for page in pages:
            chrome.get(base + page)
            shown = chrome.find_element(By.TAG_NAME, "body").text
            assert _raw_values(shown) == [], (page, [re.findall(".{0,80}" + p + ".{0,40}", shown) for p in _raw_values(shown)])
            assert "pwned" not in chrome.title
        chrome.get(base + "/health")
        installs = chrome.find_element(By.ID, "installs")
        assert {r.get_attribute("data-agent") for r in installs.find_elements(By.CSS_SELECTOR, "tr[data-agent]")} == {
            "claude-code", "codex"}
        chrome.execute_script("arguments[0].scrollIntoView()", installs)
        chrome.save_screenshot(str(shots / "health.png"))
        _sign_out(chrome)
        assert _raw_values(chrome.find_element(By.TAG_NAME, "body").text) == []
    finally:
        daemon.stop()
