"""Plugin: the real agent CLIs the agents tests drive, as `make agents` installs them (pinned): Codex (and
the newer Codex beside it), Gemini CLI, OpenCode and Qwen Code; the user configuration each needs to reach
a loopback fake of its model API, written as a new user would; an interactive session through a
pseudo-terminal (Qwen Code 0.24 runs its SessionEnd hook only when an interactive session ends, as a user
typing /quit ends it); a git repository. (The daemon as a process: fix_daemon.)"""

from __future__ import annotations

import json
import os
import pty
import pwd
import select
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio

from fix_daemon import CLI, Daemon, daemon_process
from memactors.adapters import StreamParser, Transcript
from memactors.testing.fake_chat import FakeChat
from support import run_record
from support_runs import REPO_KEY

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
CODEX_BIN = REPO / ".cache" / "agents" / "node_modules" / ".bin" / "codex"
#: The newer Codex `make agents` installs beside the pinned one (Makefile CODEX_NEXT_VERSION).
CODEX_NEXT_BIN = REPO / ".cache" / "agents" / "codex-next" / "node_modules" / ".bin" / "codex"
#: Which Codex a parametrized test runs: the pinned one and the newer one.
CODEX_VERSIONS = ("pinned", "next")
#: A model the pinned Codex knows (so it offers its freeform apply_patch tool); served by the fake.
FAKE_MODEL = "gpt-5.5"


def codex_bin(which: str = "pinned") -> Path:
    """The pinned (or the newer, ``next``) Codex binary; a missing one fails the test loudly, never skips it."""
    path = CODEX_BIN if which == "pinned" else CODEX_NEXT_BIN
    if not os.access(path, os.X_OK):
        raise AssertionError(
            f"the Codex CLI is not installed at {path}: run `make agents` (npm install of @openai/codex)")
    return path


def codex_version(path: Path) -> tuple[int, ...]:
    """``codex --version`` as numbers (``codex-cli 0.171.0`` → (0, 171, 0))."""
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    return tuple(int(part) for part in out.split()[-1].split("."))


def fake_provider_args(base_url: str) -> list[str]:
    """``-c`` overrides that point Codex at the fake Responses API, as a new user would write them."""
    provider = f'{{name="fake",base_url="{base_url}",wire_api="responses",env_key="FAKE_KEY"}}'
    return ["-c", "model_provider=fake", "-c", f"model_providers.fake={provider}", "-c", f"model={FAKE_MODEL}"]


def codex_env(codex_home: Path) -> dict[str, str]:
    """The environment for a Codex run: its own CODEX_HOME (an existing directory) and the fake's key."""
    codex_home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "CODEX_HOME": str(codex_home), "FAKE_KEY": "sk-fake-key"}


async def run_codex(argv: list[str], *, cwd: Path, env: dict[str, str]) -> trio.CompletedProcess[bytes]:
    """Run a Codex command to completion with stdin closed (exec appends piped stdin to the prompt)."""
    return await trio.run_process(argv, cwd=cwd, env=env, stdin=b"", capture_stdout=True, capture_stderr=True,
                                  check=False)


def git_repo(path: Path, remote: str = "git@forge.example:acme/ledger.git", branch: str = "fix/flaky") -> Path:
    """A git repository with an origin remote on ``branch`` (no commit needed for its repository key)."""
    path.mkdir(parents=True, exist_ok=True)
    for argv in (["git", "init", "-q", "-b", branch], ["git", "remote", "add", "origin", remote]):
        subprocess.run(argv, cwd=path, check=True, capture_output=True)
    return path


# -- Gemini CLI and OpenCode ----------------------------------------------------------------------------------

BIN = REPO / ".cache" / "agents" / "node_modules" / ".bin"
GEMINI_BIN = BIN / "gemini"
OPENCODE_BIN = BIN / "opencode"
#: Pinned in the Makefile (GEMINI_CLI_VERSION, OPENCODE_VERSION).
GEMINI_VERSION = "0.61.0"
OPENCODE_VERSION = "1.18.33"
#: A model name Gemini CLI knows: naming one skips its model router (a side call per prompt).
GEMINI_MODEL = "gemini-2.5-flash"
#: OpenCode's provider/model for the fake Responses API (configured in the user's opencode.json).
OPENCODE_MODEL = "fake/fake-model"


#: A fact of the repository a resident's session-start briefing must carry.
FACT = "ledger amounts round with Decimal, never float"


async def seed(daemon: Any, tmp_path: Path, text: str = "ledger rounding fixed with Decimal quantize") -> str:
    """An earlier run's episode in the repository (through `memactors runs ingest`), its answer ``text``;
    returns its id."""
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(run_record(result_text=text)), encoding="utf-8")
    done = await daemon.acli("runs", "ingest", str(earlier), "--json")
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)
    return str(result["episode_id"])


async def add_fact(daemon: Any) -> None:
    """FACT, in the repository's scope (`memactors facts add`)."""
    done = await daemon.acli("facts", "add", FACT, "--scope", f"project:{REPO_KEY}", "--confidence", "0.9")
    assert done.returncode == 0, done.stderr


def agent_bin(path: Path) -> Path:
    """The binary; a missing one fails the test loudly (run `make agents`), never skips it."""
    if not os.access(path, os.X_OK):
        raise AssertionError(f"{path} is not installed: run `make agents` (npm install of the pinned CLIs)")
    return path


def version(path: Path) -> str:
    return subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip().split()[-1]


def gemini_user(home: Path, base_url: str) -> dict[str, str]:
    """``~/.gemini/settings.json`` choosing API-key auth, and the variables pointing the CLI at the fake.

    Gemini CLI 0.61 treats ``GOOGLE_GEMINI_BASE_URL`` as its "gateway" auth type, which headless mode
    refuses ("Invalid auth method selected"); a user who chose the API key in settings is served at the
    base URL all the same."""
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    settings = home / ".gemini" / "settings.json"
    if not settings.exists():
        settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}, indent=2) + "\n",
                            encoding="utf-8")
    return {"GEMINI_API_KEY": "fake-gemini-key", "GOOGLE_GEMINI_BASE_URL": base_url}


def opencode_user(home: Path, base_url: str) -> dict[str, str]:
    """``~/.config/opencode/opencode.json`` with a provider for the fake Responses API (``@ai-sdk/openai``,
    bundled in OpenCode), and the variables that keep OpenCode off the network (models list, updates)."""
    directory = home / ".config" / "opencode"
    directory.mkdir(parents=True, exist_ok=True)
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"fake": {"npm": "@ai-sdk/openai", "name": "Fake",
                                    "options": {"baseURL": base_url, "apiKey": "{env:FAKE_KEY}"},
                                    "models": {"fake-model": {"name": "Fake model", "tool_call": True,
                                                              "cost": {"input": 1.0, "output": 2.0}}}}},
              "model": OPENCODE_MODEL, "small_model": OPENCODE_MODEL, "autoupdate": False, "share": "disabled"}
    (directory / "opencode.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return {"FAKE_KEY": "sk-fake-key", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}


def gateway_calls(state: Path) -> list[tuple[str, str, str]]:
    """(caller, tool, outcome) of the gateway's call log; read once the daemon has stopped."""
    db = sqlite3.connect(state / "memactors.db")
    try:
        return db.execute("SELECT caller, tool, outcome FROM call_log WHERE server = 'gateway'").fetchall()
    finally:
        db.close()


@attrs.frozen
class AgentRun:
    """One `memactors run <harness> --wait --json` as a user reads it: the exit status, the run, its episode
    (`memactors memory episodes <id>`), its events (`memactors runs logs`, when asked for) and the daemon's log."""

    returncode: int
    run: dict[str, Any]
    episode: dict[str, Any]
    events: list[dict[str, Any]]
    log: str


async def run_to_its_episode(daemon: Daemon, harness: str, *, logs: bool = False) -> AgentRun:
    """Run ``harness``'s one-shot through the CLI, wait for it, and read back its episode (and ``logs``)."""
    done = await daemon.acli("run", harness, "--wait", "--json")
    assert done.stdout, (done.stderr, daemon.log.read_text(encoding="utf-8")[-3000:])
    run = json.loads(done.stdout)
    shown = await daemon.acli("memory", "episodes", run["episode_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    events: list[dict[str, Any]] = []
    if logs:
        listed = await daemon.acli("runs", "logs", run["run_id"], "--harness", harness, "--json")
        assert listed.returncode == 0, listed.stderr
        events = [json.loads(line) for line in listed.stdout.splitlines()]
    return AgentRun(done.returncode, run, json.loads(shown.stdout)["episode"], events,
                    daemon.log.read_text(encoding="utf-8"))


def assert_the_failed_test_episode(episode: dict[str, Any], *, adapter: str, run_id: str | None) -> None:
    """An episode of the ledger task (edit NOTES.md, run the failing test), from a run or a resident's session:
    its adapter and run (``run_id`` None: a session whose id the test cannot see), the repository and branch,
    the one edit, the failed test, the outcome."""
    assert (episode["adapter"], episode["repo"]) == (adapter, REPO_KEY), episode
    assert run_id is None or episode["run_id"] == run_id, (episode["run_id"], run_id)
    assert episode["branch"] == "main"
    assert episode["files_touched"] == ["NOTES.md"]
    assert episode["verify_failures"] == [{"error_class": "test_failure", "count": 1}]
    assert episode["outcome"] == "failed"


def parsed_as_the_failed_test_session(parser: StreamParser, events: list[dict[str, Any]], *, at: str) -> Transcript:
    """Feeds ``events`` (one JSON line each) to an adapter's parser and checks the session the parser tests
    play: model m-1, one edit of a.txt, pytest failing with exit status 1, an edit that failed, the answer
    "Still failing."; the transcript, for what else the test checks."""
    for event in events:
        parser.feed(json.dumps(event), at=at)
    t = parser.transcript
    assert (t.session_id, t.model, t.result_ok, t.result_text) == ("s-1", "m-1", True, "Still failing.")
    assert [e.path for e in t.edits] == ["a.txt"]
    assert [(c.command, c.exit_code) for c in t.commands] == [("pytest", 1)]
    return t


def assert_the_failed_test_run_was_recorded(done: AgentRun, state: Path, *, harness: str, adapter: str) -> None:
    """What every agent's ledger run (recall, write NOTES.md, run the failing test, answer) must leave: the
    run failed on its test (exit 1), its episode (`assert_the_failed_test_episode`) keeps the answer, and its
    one recall went through the gateway as this run. Read once the daemon has stopped (the call log)."""
    run = done.run
    assert done.returncode == 1, (run, done.events, done.log[-3000:])
    assert (run["outcome"], run["reason"]) == ("failed", "verify_failed"), (run, done.events)
    assert_the_failed_test_episode(done.episode, adapter=adapter, run_id=run["run_id"])
    assert "2.675 is not representable" in done.episode["result_excerpt"]
    assert gateway_calls(state) == [(f"{harness}/{run['run_id']}", "recall", "ok")]


def assert_the_model_got_its_memory(fake: FakeChat, *, seeded: str, prompt: str) -> None:
    """Over the fake Chat Completions API, a ledger run's memory reached the model: the recall's document
    (naming the ``seeded`` episode) came back as the tool result of its second request, and its first user
    message carried the fenced briefing before the configured ``prompt`` (REQ-16)."""
    agent = fake.agent_requests()
    assert seeded in " ".join(agent[1].tool_results())
    first = json.dumps(agent[0].body)
    assert first.index("memory-data kind=\\\"briefing\\\"") < first.index(prompt)


async def the_only_episode(daemon: Daemon, harness: str = "coder") -> dict[str, Any]:
    """The one episode of ``harness``, in full, as `memactors memory episodes` lists and shows it."""
    listed = await daemon.acli("memory", "episodes", "--harness", harness, "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)["episodes"]
    shown = await daemon.acli("memory", "episodes", row["episode_id"], "--json")
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout)["episode"])


def left_while_down(state: Path) -> tuple[list[str], dict[str, Any]]:
    """What a resident session leaves when the daemon is down: the harnesses whose SessionStart found no
    daemon (`session-start-failures.jsonl`), and the one session record spooled to send later."""
    failures = (state / "session-start-failures.jsonl").read_text(encoding="utf-8").splitlines()
    [spooled] = [json.loads(line) for line in (state / "session-spool.jsonl").read_text(
        encoding="utf-8").splitlines()]
    return [json.loads(line)["harness"] for line in failures], dict(spooled["record"])


def _others_may_write(path: Path) -> bool:
    """Whether a directory above `path` (that exists) may be written by group or others: Gemini CLI's test."""
    return any(p.exists() and p.stat().st_mode & 0o022 for p in path.parents)


@contextmanager
def secure_dir(name: str) -> Iterator[Path]:
    """A private directory none of whose parents others may write: Gemini CLI skips a system settings file
    (the run's MCP config, in the daemon's state directory) below a directory writable by group or others,
    such as /tmp, where pytest's tmp_path lives. Under the worktree's git-ignored .cache (or, for a
    clone below such a directory, under ~/.cache), removed after."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)  # the account's, not the suite's isolated $HOME
    base = next((b for b in (REPO / ".cache" / "test-tmp", home / ".cache" / "memactors-test-tmp")
                 if not _others_may_write(b)), None)
    if base is None:
        raise RuntimeError(f"no private directory for {name}: {REPO} and {home} both lie below a directory "
                           "group or others may write (Gemini CLI would skip the run's settings); clone elsewhere")
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    path.chmod(0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- Qwen Code ------------------------------------------------------------------------------------------------

QWEN_BIN = BIN / "qwen"
QWEN_VERSION = "0.24.4"
QWEN_MODEL = "fake-chat"


def qwen_user(home: Path, base_url: str) -> dict[str, str]:
    """``~/.qwen/settings.json`` choosing the OpenAI-compatible auth, and the variables pointing the CLI at
    the fake (what a user of a self-hosted OpenAI-compatible model sets)."""
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    settings = home / ".qwen" / "settings.json"
    if not settings.exists():
        settings.write_text(json.dumps({"security": {"auth": {"selectedType": "openai"}}}, indent=2) + "\n",
                            encoding="utf-8")
    return {"HOME": str(home), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-fake", "OPENAI_MODEL": QWEN_MODEL,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1", "TERM": "xterm-256color"}


def interactive(argv: list[str], *, cwd: Path, env: dict[str, str], done_when: bytes,
                limit: float = 240.0) -> tuple[int, bytes]:
    """Run ``argv`` on a pseudo-terminal; once its screen shows ``done_when``, type ``/quit`` and wait for it to
    exit. Returns (exit status, everything it printed). A hang guard, never a timing assertion: past
    ``limit`` seconds the process is killed and the status is -9."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become the agent
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    out, quit_sent, status = b"", False, None
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                out += data
            if not quit_sent and done_when in out:
                time.sleep(0.5)  # ok: let the prompt line redraw before typing, as a user would
                os.write(fd, b"/quit\r")
                quit_sent = True
            finished, code = os.waitpid(pid, os.WNOHANG)
            if finished:
                status = os.waitstatus_to_exitcode(code)
                break
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = -9
    finally:
        os.close(fd)
    return status if status is not None else -9, out


# -- pi and Claude Code as residents, the install tests' reads ---------------------------------------------

PI_BIN = BIN / "pi"


def pi_user(home: Path, base_url: str) -> None:
    """``~/.pi/agent/models.json``: a provider for an OpenAI-compatible endpoint (the fake), as a user of a
    self-hosted model writes it."""
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    (agent / "models.json").write_text(json.dumps({"providers": {"fake": {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "sk-fake",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "fake-chat"}]}}}), encoding="utf-8")


CLAUDE_BIN = REPO / ".cache" / "agents" / "node_modules" / ".bin" / "claude"


def claude_bin() -> Path:
    """The pinned Claude Code binary; a missing one fails the test loudly, never skips it."""
    if not os.access(CLAUDE_BIN, os.X_OK):
        raise AssertionError(f"Claude Code is not installed at {CLAUDE_BIN}: install the agent CLIs into .cache/agents")
    return CLAUDE_BIN


def claude_env(home: Path, daemon_env: dict[str, str], base_url: str) -> dict[str, str]:
    """The environment of a user's headless `claude -p` against the fake API (HOME: their own)."""
    return {**daemon_env, "HOME": str(home), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-fake",
            "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}


async def claude_p(claude: Path, prompt: str, *, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """`claude -p` exactly as a user types it in the project: no --mcp-config, no --allowedTools."""
    done = await trio.run_process([str(claude), "-p", prompt, "--output-format", "stream-json", "--verbose"],
                                  cwd=cwd, env=env, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, (out[-3000:], done.stderr.decode(errors="replace")[-3000:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text(encoding="utf-8"))


async def gateway_status(url: str, token: str) -> int:
    """The HTTP status of an MCP initialize presenting ``token``: 200 live, 401 refused."""
    async with httpx2.AsyncClient(timeout=None) as http:
        answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}},
            headers={"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"})
    return answer.status_code


def transcript_in(repo: Path, tmp_path: Path) -> Path:
    """The recorded Claude Code transcript fixture, as if the session had run in ``repo``."""
    path = tmp_path / "session.jsonl"
    path.write_text((DATA / "claude_transcript_session.jsonl").read_text(encoding="utf-8").replace("{CWD}", str(repo)),
                    encoding="utf-8")
    return path


#: A claude-code harness, `coder`: the resident the install and client-configuration tests connect.
HARNESS = '[harness.coder]\nharness = "claude-code"\n'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The daemon as a process with the claude-code harness `coder` (HARNESS), one for the module that
    imports this fixture (a daemon costs ~2 s of CPU to start): the install, uninstall and client-configuration
    tests mint their own tokens and write their own files, so none depends on a fresh one."""
    with daemon_process(tmp_path_factory.mktemp("daemon"), HARNESS) as running:
        yield running


def memactors(daemon: Daemon, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it against ``daemon``, with their own HOME (where --user writes) and none of the
    variables that would point an agent's configuration elsewhere."""
    env = {**daemon.env, "HOME": str(home)}
    for name in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "GEMINI_CLI_HOME", "XDG_CONFIG_HOME"):
        env.pop(name, None)
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
