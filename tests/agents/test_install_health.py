"""Silence is reported: every `memactors install` says whether it is working. A real Codex
installed in a project whose hooks were never trusted runs one `codex exec` session (against the loopback
Responses fake): it reaches the gateway with its token, but no session is recorded. `memory status --json`,
`doctor` (both as subprocesses), the console's health page and `/metrics` (checked by promtool) show it:
doctor warns naming Codex's hook trust (`/hooks`). Then a session record arrives as the hook would send it,
and the install is working again. The daemon's "a day" is shortened to a second (`SILENT_SECONDS`, the only
change; `fix_daemon` constants)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from fix_agents import codex_bin, codex_env, fake_provider_args, run_codex
from fix_daemon import start_daemon
from memactors.cli.install import run_id_for
from memactors.testing.fake_openai import Message, Turn, run_fake_openai
from support import run_record
from support_console import csrf_of, rpc
from support_runs import make_repo

pytestmark = pytest.mark.slow

API = "forge.example/acme/api"
HARNESS = '[harness.coder]\nharness = "codex"\n[console]\nenabled = true\nlisten = "127.0.0.1:0"\n'


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            got = ",".join(sorted(head[len(name) + 1:-1].split(",")))
            if got == want:
                return float(value)
    return None


async def test_a_codex_whose_hooks_were_never_trusted_is_reported_silent_with_its_trust_step(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "api")
    home = codex_env(tmp_path / "codex-home")
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(
        tmp_path, extra_config=HARNESS, constants={"memactors.service.installs.SILENT_SECONDS": 1.0}))
    env = {**daemon.env, "CODEX_HOME": home["CODEX_HOME"]}

    async def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process([sys.executable, "-m", "memactors.cli", *args], env=env, stdin=b"",
                                      capture_stdout=True, capture_stderr=True, check=False)

    try:
        installed = await cli("install", "codex", "--harness", "coder", "--project", str(repo))
        assert installed.returncode == 0, installed.stderr.decode()
        before = json.loads((await cli("memory", "status", "--json")).stdout)["installs"]
        assert [(i["agent"], i["scope"], i["harness"]) for i in before] == [("codex", "project", "coder")]
        assert before[0]["last_session_at"] is None and before[0]["last_connected_at"] is None

        # One session: the project trusted (MCP config read), its hooks never trusted (`/hooks`).
        async with run_fake_openai([Turn([Message("Nothing to recall for this.")])]) as fake:
            done = await run_codex([str(codex_bin()), "exec", "--json", "--trust", *fake_provider_args(fake.base_url),
                                    "--", "say hello"], cwd=repo, env=home)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        with trio.fail_after(60):  # a hang guard: the daemon's "day" is one second
            while True:
                [install] = json.loads((await cli("memory", "status", "--json")).stdout)["installs"]
                if "reached the gateway" in (install["problem"] or ""):
                    break
                await trio.sleep(0.2)
        assert install["run_id"] == run_id_for("codex", repo.resolve())
        assert install["last_connected_at"] is not None and install["last_session_at"] is None
        assert "/hooks" in install["problem"] and "Codex runs hooks only after you trust them" in install["problem"]

        doctor = await cli("doctor")
        text = doctor.stdout.decode()
        [row] = [line for line in text.splitlines() if "install codex project (coder)" in line]
        assert "warn" in row.lower() and "/hooks" in row, text

        # The console's health page says the same, for people.
        base = daemon.info["console"].rstrip("/")
        async with httpx2.AsyncClient(base_url=base, follow_redirects=True) as web:
            page = await web.get("/login")
            await web.post("/login", data={"token": daemon.token("read"), "csrf": csrf_of(page.text)},
                           headers={"origin": base})
            health = (await web.get("/health")).text
        assert 'class="install-stale" data-agent="codex"' in health and "/hooks" in health

        # A session recorded (as Codex's SessionEnd hook sends it, once trusted): working again, counted.
        record = run_record(harness="coder", adapter="codex", run_id="019a-session",
                            trigger={"source": "manual", "name": "session-end"},
                            sessions=[{"session_id": "019a-session", "cwd": str(repo), "repo": "forge.example/acme/api",
                                       "git_branch": "main"}])
        assert rpc(daemon, "IngestRun", record=record, source="codex session-end 019a-session")["outcome"] in (
            "recorded", "queued")
        [install] = json.loads((await cli("memory", "status", "--json")).stdout)["installs"]
        assert install["ok"] and install["sessions"] == 1 and install["last_session_at"] is not None

        async with httpx2.AsyncClient() as http:
            exposition = (await http.get(daemon.info["metrics"])).text
    finally:
        await trio.to_thread.run_sync(daemon.stop)
    assert _metric(exposition, "harness_memory_resident_sessions_total", agent="codex", outcome="recorded") == 1 \
        or _metric(exposition, "harness_memory_resident_sessions_total", agent="codex", outcome="queued") == 1
    for family in ("harness_memory_runs_started_total", "harness_memory_runs_ended_total",
                   "harness_memory_run_duration_seconds", "harness_memory_imported_records_total"):
        assert f"# TYPE {family.removesuffix('_total')}" in exposition or f"# TYPE {family}" in exposition
    # Labels stay within SPEC-0013's rules: no run id, repository or path in any of the install-health series.
    for line in exposition.splitlines():
        if line.startswith(("harness_memory_resident", "harness_memory_run", "harness_memory_imported")):
            assert "019a" not in line and "forge.example" not in line and str(repo) not in line, line
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = await trio.run_process([promtool, "check", "metrics"], stdin=exposition.encode(),
                                     capture_stdout=True, capture_stderr=True, check=False)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def test_silence_is_judged_per_install_with_the_cause_its_agent_most_often_has() -> None:
    """The rules behind doctor's install rows, on fixed times: seen at the gateway and no session within a
    day warns; a day of daemon without a session warns (a day-old install); a recorded session, a young
    install or a daemon up for less than a day does not; each warning names that agent's likely cause."""
    from datetime import UTC, datetime, timedelta

    from memactors.service.installs import InstallActivity, install_rows

    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    day, hour = timedelta(days=1), timedelta(hours=1)

    def stored(agent: str, *, installed: datetime, session: datetime | None = None) -> dict[str, object]:
        return {"agent": agent, "scope": "project", "harness": f"h-{agent}", "run_id": f"resident-{agent}-project-0123abcd",
                "workdir": "/srv/api", "installed_at": installed.isoformat(), "expires_at": None,
                "last_session_at": session.isoformat() if session else None, "sessions": 1 if session else 0,
                "cached_briefing_at": None}

    long_up = InstallActivity(started=now - 3 * day)
    long_up.saw("h-codex", "resident-codex-project-0123abcd", now - 2 * day)
    long_up.saw("h-claude-code", "resident-claude-code-project-0123abcd", now - 2 * hour)
    long_up.briefed_at("h-gemini-cli", "resident-gemini-cli-project-0123abcd", now - 2 * day)
    long_up.saw("h-x", "run-42", now)  # not an install's run: not kept
    rows = {r["agent"]: r for r in install_rows([
        stored("codex", installed=now - 10 * day, session=now - 5 * day),  # seen since, no session: silent
        stored("gemini-cli", installed=now - 10 * day),  # briefed two days ago, never a session
        stored("claude-code", installed=now - 10 * day, session=now - 3 * hour),  # seen 2 h ago: still in session
        stored("opencode", installed=now - 10 * day, session=now - 30 * day),  # a day of daemon, no session
        stored("pi", installed=now - hour),  # installed an hour ago
    ], long_up, now)}
    assert ("run-42" not in str(long_up.connected)) and len(long_up.connected) == 2
    assert not rows["codex"]["ok"] and "reached the gateway" in rows["codex"]["problem"]
    assert "`/hooks`" in rows["codex"]["problem"] and "spool" in rows["codex"]["problem"]
    assert not rows["gemini-cli"]["ok"] and "trusted folder" in rows["gemini-cli"]["problem"]
    assert rows["gemini-cli"]["last_briefing_at"].startswith("2026-12-05T12:00:00")
    assert rows["claude-code"]["ok"] and rows["claude-code"]["problem"] is None
    assert not rows["opencode"]["ok"] and "while the daemon ran for the last 72 h" in rows["opencode"]["problem"]
    assert "plugin" in rows["opencode"]["problem"]
    assert rows["pi"]["ok"]
    # A daemon up for an hour has not seen a day of silence, whatever the store says.
    fresh = install_rows([stored("opencode", installed=now - 10 * day, session=now - 30 * day)],
                         InstallActivity(started=now - hour), now)
    assert fresh[0]["ok"]


def test_doctor_names_a_daemon_down_at_session_start_first_for_a_silent_install() -> None:
    from memactors.doctor import install_doctor_rows

    silent = {"agent": "claude-code", "scope": "user", "harness": "api-fixer", "problem": "no session recorded",
              "last_session_at": None, "last_briefing_at": None, "last_connected_at": None}
    working = {**silent, "agent": "codex", "harness": "coder", "problem": None, "sessions": 3}
    started = {"count": 2, "last_at": "2026-12-07T09:00:00Z", "last_error": "timed out", "harnesses": ["api-fixer"]}
    rows = install_doctor_rows([silent, working], started)
    assert [(r.status, r.name) for r in rows] == [("warn", "install claude-code user (api-fixer)"),
                                                  ("pass", "install codex user (coder)")]
    assert rows[0].message.startswith("sessions of api-fixer started while the daemon did not answer (last at "
                                      "2026-12-07T09:00:00Z); no session recorded")
    assert rows[1].message.startswith("3 sessions recorded")
    assert install_doctor_rows([silent], None)[0].message.startswith("no session recorded")


@pytest.mark.both_engines
async def test_installs_are_read_from_the_store_on_either_engine(memory: Any, engine: str) -> None:
    """The installs `memory status` lists, from the store (SQLite and PostgreSQL): a resident token install
    minted, the gateway resolving it, a briefing served, a session recorded; a non-resident run token is
    no install."""
    from memactors.service.installs import SILENT_SECONDS

    assert SILENT_SECONDS == 86400.0
    minted = await memory.mint_run_token(harness="api-fixer", run_id="resident-claude-code-user-0123abcd",
                                         ttl_seconds=3600)
    await memory.mint_run_token(harness="api-fixer", run_id="42", ttl_seconds=3600)
    [fresh] = await memory.install_status()
    assert (fresh["agent"], fresh["scope"], fresh["harness"], fresh["sessions"]) == ("claude-code", "user", "api-fixer", 0)
    assert fresh["ok"] and fresh["last_connected_at"] is None and fresh["last_session_at"] is None
    view = await memory.caller_view(minted["token"])
    await memory.agent_briefing(view, delivery="tool")
    await memory.ingest_run(run_record(run_id="s-1", trigger={"source": "manual", "name": "session-end"}),
                            source="claude-code session-end s-1")
    [after] = await memory.install_status()
    assert after["last_connected_at"] and after["last_briefing_at"] and after["last_session_at"]
    assert after["sessions"] == 1 and after["ok"]
    assert memory.metrics.resident_sessions.labels("claude-code", "recorded")._value.get() \
        + memory.metrics.resident_sessions.labels("claude-code", "queued")._value.get() == 1
    # A project install of the same agent on the same harness: its sessions are the ones run inside it.
    await memory.mint_run_token(harness="api-fixer", run_id="resident-claude-code-project-89abcdef",
                                workdir="/srv/api", ttl_seconds=3600)
    for n, cwd in enumerate(("/srv/api", "/srv/api/sub", "/srv/apix", "/home/me")):
        await memory.ingest_run(run_record(run_id=f"p-{n}", trigger={"source": "manual", "name": "session-end"},
                                           sessions=[{"session_id": f"p-{n}", "cwd": cwd, "repo": API,
                                                      "git_branch": "main"}]), source=f"session-end p-{n}")
    by_scope = {i["scope"]: i for i in await memory.install_status()}
    # /srv/api and /srv/api/sub (and the first session, run in /srv/api) are the project's; /srv/apix is not
    assert (by_scope["project"]["sessions"], by_scope["user"]["sessions"]) == (3, 2), by_scope
