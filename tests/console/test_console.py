"""The web console over HTTP against a real daemon process: sign-in, CSRF and Origin checks,
the tiers, scope isolation in the recall playground, agent-written text rendered inert."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from fix_daemon import Daemon
from support_console import API, WEB, console_daemon, csrf_of, rpc, seed

pytestmark = [pytest.mark.slow, pytest.mark.req19]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    # Two episodes a page, so three episodes make two pages.
    daemon = console_daemon(tmp_path_factory.mktemp("console"), constants={"memactors.console.app.PAGE_SIZE": 2})
    try:
        yield daemon, seed(daemon)
    finally:
        daemon.stop()


def _base(daemon: Daemon) -> str:
    return daemon.info["console"].rstrip("/")


def _client(daemon: Daemon) -> httpx2.Client:
    return httpx2.Client(base_url=_base(daemon), timeout=60, follow_redirects=False)


def _origin(daemon: Daemon) -> dict[str, str]:
    return {"origin": _base(daemon)}


@contextmanager
def sign_in(daemon: Daemon, tier: str) -> Iterator[httpx2.Client]:
    with _client(daemon) as client:
        page = client.get("/login")
        assert page.status_code == 200
        done = client.post("/login", data={"csrf": csrf_of(page.text), "token": daemon.token(tier)},
                           headers=_origin(daemon))
        assert done.status_code == 303, done.text
        assert done.headers["location"] == "/episodes"
        yield client


def test_console_sign_in_sets_a_strict_http_only_cookie(seeded: tuple[Daemon, dict[str, str]]) -> None:
    daemon, _ = seeded
    with _client(daemon) as client:
        assert client.get("/episodes").headers["location"] == "/login"  # no session: sent to sign in
        page = client.get("/login")
        refused = client.post("/login", data={"csrf": csrf_of(page.text), "token": "not-a-token"},
                              headers=_origin(daemon))
        assert refused.status_code == 401 and "memactors_console=" not in refused.headers.get("set-cookie", "")
        page = client.get("/login")
        done = client.post("/login", data={"csrf": csrf_of(page.text), "token": daemon.token("read")},
                           headers=_origin(daemon))
        cookies = [v for k, v in done.headers.multi_items() if k == "set-cookie" and v.startswith("memactors_console=")]
        assert len(cookies) == 1
        attributes = [part.strip().lower() for part in cookies[0].split(";")]
        assert "httponly" in attributes and "samesite=strict" in attributes
        assert daemon.token("read") not in cookies[0]  # the session id, never the token
        listed = client.get("/episodes")
        assert listed.status_code == 200 and 'id="tier">read tier' in listed.text
        for header in ("content-security-policy", "x-frame-options", "x-content-type-options"):
            assert header in listed.headers
        assert "script-src 'self'" in listed.headers["content-security-policy"]


def test_console_refuses_posts_without_csrf_or_from_another_origin(
        seeded: tuple[Daemon, dict[str, str]]) -> None:
    daemon, ids = seeded
    with sign_in(daemon, "control") as client:
        page = client.get(f"/episodes/{ids['api2']}/forget")
        assert page.status_code == 200 and 'id="confirm"' in page.text
        csrf = csrf_of(page.text)
        action = f"/episodes/{ids['api2']}/forget"
        no_token = client.post(action, data={"confirm": "yes"}, headers=_origin(daemon))
        wrong_token = client.post(action, data={"confirm": "yes", "csrf": csrf[:-2] + "xx"}, headers=_origin(daemon))
        other_origin = client.post(action, data={"confirm": "yes", "csrf": csrf},
                                   headers={"origin": "http://attacker.example"})
        no_origin = client.post(action, data={"confirm": "yes", "csrf": csrf})
        for refused in (no_token, wrong_token, other_origin, no_origin):
            assert refused.status_code == 403, refused.text
        # A page that rebinds its own name to 127.0.0.1 reaches the port under that name: refused.
        rebound = client.get("/episodes", headers={"host": f"attacker.example:{client.base_url.port}"})
        assert rebound.status_code == 421
        # None of them forgot anything.
        assert rpc(daemon, "GetEpisode", "read", episode_id=ids["api2"])["forgotten_at"] is None
        # The sign-in form too: a login from another origin, or without its own CSRF cookie, is refused.
        with _client(daemon) as fresh:
            login = fresh.get("/login")
            forged = fresh.post("/login", data={"csrf": csrf_of(login.text), "token": daemon.token("read")},
                                headers={"origin": "http://attacker.example"})
            assert forged.status_code == 403
        with _client(daemon) as cookieless:
            forged = cookieless.post("/login", data={"csrf": csrf_of(login.text), "token": daemon.token("read")},
                                     headers=_origin(daemon))
            assert forged.status_code == 403


def test_console_read_token_is_refused_a_forget_and_control_token_forgets(
        tmp_path: Path) -> None:
    daemon = console_daemon(tmp_path)
    try:
        ids = seed(daemon)
        target = ids["api2"]
        with sign_in(daemon, "read") as reader:
            page = reader.get(f"/episodes/{target}/forget")
            assert 'id="needs-control"' in page.text
            refused = reader.post(f"/episodes/{target}/forget", data={"confirm": "yes", "csrf": csrf_of(page.text)},
                                  headers=_origin(daemon))
            assert refused.status_code == 403 and 'data-code="PERMISSION_DENIED"' in refused.text
            assert rpc(daemon, "GetEpisode", "read", episode_id=target)["forgotten_at"] is None
            for control in ("/health/check-provider", "/runs/x/cancel"):
                assert reader.post(control, data={"confirm": "yes", "csrf": csrf_of(page.text)},
                                   headers=_origin(daemon)).status_code == 403
        with sign_in(daemon, "control") as operator:
            page = operator.get(f"/episodes/{target}/forget")
            unconfirmed = operator.post(f"/episodes/{target}/forget", data={"csrf": csrf_of(page.text)},
                                        headers=_origin(daemon))
            assert unconfirmed.status_code == 200 and 'id="confirm"' in unconfirmed.text  # asks again
            assert rpc(daemon, "GetEpisode", "read", episode_id=target)["forgotten_at"] is None
            done = operator.post(f"/episodes/{target}/forget", data={"confirm": "yes", "csrf": csrf_of(page.text)},
                                 headers=_origin(daemon))
            assert done.status_code == 200 and 'id="done"' in done.text, done.text
            assert rpc(daemon, "GetEpisode", "read", episode_id=target)["forgotten_at"] is not None
            shown = operator.get(f"/episodes/{target}")
            assert 'id="forgotten"' in shown.text and 'id="forget"' not in shown.text
            # The provider check, also behind a confirmation, through CheckProvider.
            page = operator.get("/health/check-provider")
            assert 'id="confirm"' in page.text and 'id="needs-control"' not in page.text
            checked = operator.post("/health/check-provider", data={"confirm": "yes", "csrf": csrf_of(page.text)},
                                    headers=_origin(daemon))
            assert checked.status_code == 200 and 'id="done"' in checked.text
            assert '<dt>ok</dt><dd data-key="ok">yes</dd>' in checked.text, checked.text[-3000:]
    finally:
        daemon.stop()


def _listed(page: str) -> list[str]:
    return re.findall(r'<tr data-episode="([^"]+)">', page)


def _recall(client: httpx2.Client, daemon: Daemon, **form: str) -> httpx2.Response:
    page = client.get("/recall")
    return client.post("/recall", data={"csrf": csrf_of(page.text), **form}, headers=_origin(daemon))


def test_console_recall_as_a_repository_sees_only_its_scope(seeded: tuple[Daemon, dict[str, str]]) -> None:
    daemon, ids = seeded
    with sign_in(daemon, "read") as client:
        as_api = _recall(client, daemon, query="ledger rounding", as_kind="repo", target=API)
        assert as_api.status_code == 200, as_api.text
        assert ids["api"] in as_api.text and ids["web"] not in as_api.text
        assert "fixed the ledger rounding in the api" in as_api.text
        assert 'id="latency"' in as_api.text and 'id="drops"' in as_api.text and 'class="score"' in as_api.text
        as_web = _recall(client, daemon, query="ledger rounding", as_kind="repo", target=WEB)
        assert ids["web"] in as_web.text and ids["api"] not in as_web.text
        as_harness = _recall(client, daemon, query="ledger rounding", as_kind="harness", target="web-fixer")
        assert as_harness.status_code == 200, as_harness.text
        assert ids["web"] in as_harness.text and ids["api"] not in as_harness.text
        unknown = _recall(client, daemon, query="q", as_kind="harness", target="no-such-harness")
        assert unknown.status_code == 400 and 'data-code="INVALID_ARGUMENT"' in unknown.text


def test_console_shows_an_xss_payload_inert_and_marked_untrusted(
        seeded: tuple[Daemon, dict[str, str]]) -> None:
    daemon, ids = seeded
    with sign_in(daemon, "read") as client:
        pages: list[Any] = [client.get(f"/episodes/{ids['web']}"),
                            _recall(client, daemon, query="ledger rounding", as_kind="repo", target=WEB),
                            client.get("/briefings/web-fixer")]
        for page in pages:
            assert page.status_code == 200, (page.url, daemon.log_text()[-3000:])
            text = page.text
            assert "<script>document.title" not in text and "<img src=x" not in text
            assert "&lt;script&gt;document.title=" in text  # shown, as text
            if "/briefings/" not in str(page.url):  # (a briefing's item is the payload's first 80 characters)
                assert "&lt;img src=x onerror=" in text
            assert 'data-untrusted="agent"' in text


def test_console_lists_filters_and_pages_episodes(seeded: tuple[Daemon, dict[str, str]]) -> None:
    daemon, ids = seeded
    with sign_in(daemon, "read") as client:
        first = client.get("/episodes")
        shown = _listed(first.text)
        assert len(shown) == 2 and 'id="next-page"' in first.text
        second = client.get(html.unescape(re.search(r'<a href="([^"]+)" id="next-page"', first.text).group(1)))
        assert second.status_code == 200 and 'id="next-page"' not in second.text and 'id="first-page"' in second.text
        assert sorted(shown + _listed(second.text)) == sorted(ids.values())  # every episode once
        # The outcome filter reads on through the service's pages until a console page is full.
        succeeded = client.get("/episodes", params={"outcome": "succeeded"})
        assert sorted(_listed(succeeded.text)) == sorted([ids["api"], ids["web"]])
        by_repo = client.get("/episodes", params={"repo": "acme/web"})  # owner/name is read as the key
        assert ids["web"] in by_repo.text and ids["api"] not in by_repo.text
        by_outcome = client.get("/episodes", params={"outcome": "failed"})
        assert ids["api2"] in by_outcome.text and ids["api"] not in by_outcome.text
        by_harness = client.get("/episodes", params={"harness": "web-fixer", "since": "3650d"})
        assert ids["web"] in by_harness.text and ids["api"] not in by_harness.text
        bad_since = client.get("/episodes", params={"since": "yesterday-ish"})
        assert bad_since.status_code == 400
        episode = client.get(f"/episodes/{ids['api']}")
        assert 'id="index-rows"' in episode.text and "builtin" in episode.text and API in episode.text
        health = client.get("/health")
        assert health.status_code == 200 and "<svg" in health.text and 'id="doctor"' in health.text
        briefing = client.get("/briefings/api-fixer")
        assert briefing.status_code == 200 and 'id="figures"' in briefing.text


def test_console_follows_a_run_log_over_server_sent_events_and_cancels_it(tmp_path: Path) -> None:
    daemon = console_daemon(tmp_path, runs=True)
    try:
        started = rpc(daemon, "StartRun", harness="long")
        run_id = started["run_id"]
        with sign_in(daemon, "read") as reader, sign_in(daemon, "control") as operator:
            listed = reader.get("/runs", params={"state": "running"})
            assert f'data-run="{run_id}"' in listed.text
            page = reader.get(f"/runs/{run_id}", params={"harness": "long"})
            assert 'data-live="yes"' in page.text and 'id="cancel"' in page.text
            refused = reader.post(f"/runs/{run_id}/cancel?harness=long", data={"confirm": "yes",
                                  "csrf": csrf_of(page.text)}, headers=_origin(daemon))
            assert refused.status_code == 403
            assert rpc(daemon, "GetRun", "read", run_id=run_id)["state"] == "running"
            with reader.stream("GET", f"/runs/{run_id}/events", params={"harness": "long", "after": 0}) as events:
                assert events.headers["content-type"].startswith("text/event-stream")
                lines = events.iter_lines()
                assert next(lines) == "retry: 2000"
                confirm = operator.get(f"/runs/{run_id}/cancel", params={"harness": "long"})
                done = operator.post(f"/runs/{run_id}/cancel?harness=long",
                                     data={"confirm": "yes", "csrf": csrf_of(confirm.text)}, headers=_origin(daemon))
                assert done.status_code == 200 and 'id="done"' in done.text
                seen: list[str] = []
                for line in lines:  # the stream ends after its `end` event: no timing involved
                    seen.append(line)
                    if line == "event: end":
                        break
            assert any("cancel asked" in line for line in seen), seen
            assert any(line.startswith("data: ") and "cancelled" in line for line in seen), seen
            assert rpc(daemon, "WaitRun", "read", run_id=run_id, harness="long")["outcome"] == "cancelled"
    finally:
        daemon.stop()
