"""The `memactors` CLI as a user meets it: help text, --version, completion, --config on
either side of the subcommand, distinct exit codes, forget's confirmation, `runs ingest` over files,
directories and stdin with a summary (and Ctrl-C), `memory episodes` pages, `--repo` read as the
daemon's repository key, and a start-up that imports only what the command needs.

The daemon runs in-process on port 0; the CLI runs as a real subprocess against it.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import memactors
from fix_daemon import daemon_in_process
from memactors import cli
from memactors.cli import runs as cli_runs
from memactors.daemon import Listening
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from support import EXAMPLES, acknowledged, read_terminal, run_record, write_config

SERVICE = "harness.v1.MemoryService"
API = "forge.example/acme/api"


def run_cli(config: Path | None, *args: str, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "memactors.cli", *args]
    if config is not None:
        argv += ["--config", str(config)]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False,
                          env=env or {**os.environ, "HOME": str(config.parent if config else Path.cwd())})


async def arun_cli(config: Path | None, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: run_cli(config, *args, stdin=stdin))


async def ingest(listening: Listening, state: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with connect_rpc(listening.operator, read_token(state, "control")) as rpc:
        out = await rpc.call(f"{SERVICE}/IngestRuns",
                             {"records": [{"record": r, "source": f"r{i}"} for i, r in enumerate(records)]})
    return out["results"]


# -- parser: help, version, --config, completion ---------------------------------------------------------

def test_every_option_and_positional_has_help_text() -> None:
    missing = []
    for parser in cli.subparsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                if isinstance(action, argparse._SubParsersAction):
                    missing += [f"{parser.prog} {c.dest}" for c in action._choices_actions if not c.help]
                continue
            if not action.help:
                missing.append(f"{parser.prog} {action.dest}")
    assert missing == []


def test_version_prints_the_package_version() -> None:
    done = run_cli(None, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"memactors {memactors.__version__}"


@pytest.mark.parametrize("argv", [
    ["--config", "/x/harness.toml", "memory", "status"],
    ["memory", "status", "--config", "/x/harness.toml"],
    ["memory", "--config", "/x/harness.toml", "status"],
])
def test_config_is_accepted_before_or_after_the_subcommand(argv: list[str]) -> None:
    assert cli.build_parser().parse_args(argv).config == "/x/harness.toml"


def test_config_defaults_to_none_when_not_given() -> None:
    assert cli.build_parser().parse_args(["memory", "status"]).config is None


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_the_shell_accepts(shell: str, tmp_path: Path) -> None:
    done = run_cli(None, "completion", shell)
    assert done.returncode == 0, done.stderr
    assert "memactors" in done.stdout and "ingest" in done.stdout and "episodes" in done.stdout
    if shell == "bash":
        script = tmp_path / "memactors.bash"
        script.write_text(done.stdout)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0


def test_a_usage_error_exits_2() -> None:
    done = run_cli(None, "memory", "recall", "words")  # needs --repo or --as
    assert done.returncode == 2
    assert "one of the arguments --repo --as is required" in done.stderr


# -- exit codes ------------------------------------------------------------------------------------------

def test_no_daemon_ever_started_exits_3_and_says_how_to_start_one(tmp_path: Path) -> None:
    done = run_cli(write_config(tmp_path), "memory", "status")
    assert done.returncode == cli.EXIT_UNAVAILABLE == 3
    assert "memactors serve" in done.stderr and "Traceback" not in done.stderr


def test_a_daemon_that_is_not_listening_exits_3(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    for tier in ("read", "control"):
        (state / f"operator-{tier}.token").write_text(f"{tier}-token-0123456789")
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (state / "daemon.json").write_text(json.dumps({"operator": f"ws://127.0.0.1:{port}/harness.v1"}))
    done = run_cli(config, "memory", "episodes")
    assert done.returncode == 3, done.stderr
    assert "UNAVAILABLE" in done.stderr


def test_an_invalid_configuration_exits_5(tmp_path: Path) -> None:
    """A control command needs a valid configuration; a read command falls back to the state directory
    (an operator can still ask the running daemon), warning with the same error."""
    config = tmp_path / "harness.toml"
    config.write_text('[store]\npath = ""\n')
    done = run_cli(config, "memory", "forget", "ep_0", "--yes")
    assert done.returncode == cli.EXIT_INVALID == 5
    assert "[store] path" in done.stderr
    read = run_cli(config, "memory", "status")
    assert "[store] path" in read.stderr and read.returncode == cli.EXIT_UNAVAILABLE


@pytest.mark.parametrize(("code", "status"), [
    ("UNAVAILABLE", 3), ("DEADLINE_EXCEEDED", 3), ("NOT_FOUND", 4), ("INVALID_ARGUMENT", 5),
    ("FAILED_PRECONDITION", 5), ("PERMISSION_DENIED", 6), ("UNAUTHENTICATED", 6), ("INTERNAL", 7),
    ("UNKNOWN", 7),
])
def test_each_rpc_error_code_maps_to_its_documented_exit_status(code: str, status: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from memactors.rpc.frames import RpcError

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RpcError(code, "x")

    monkeypatch.setattr(cli.memory, "call", fail)
    assert cli.main(["memory", "status"]) == status
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert f"| {status} |" in doc  # the table in docs/operations.md names it


@pytest.mark.slow
async def test_not_found_permission_denied_and_invalid_argument_exit_distinctly(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (config, _):
        missing = await arun_cli(config, "memory", "episodes", "ep_00000000000000000000")
        assert missing.returncode == 4, missing.stderr
        assert "NOT_FOUND" in missing.stderr
        bad_cursor = await arun_cli(config, "memory", "episodes", "--after", "not-a-cursor")
        assert bad_cursor.returncode == 5 and "after" in bad_cursor.stderr
        (tmp_path / "state" / "operator-control.token").write_text("someone-elses-token-0000")
        denied = await arun_cli(config, "memory", "forget", "ep_00000000000000000000", "--yes")
        assert denied.returncode == 6, denied.stderr
        assert "Traceback" not in denied.stderr


# -- forget asks first -------------------------------------------------------------------------------------

def test_forget_refuses_without_a_terminal_unless_yes(tmp_path: Path) -> None:
    done = run_cli(write_config(tmp_path), "memory", "forget", "ep_00000000000000000000", stdin="y\n")
    assert done.returncode == 5
    assert "--yes" in done.stderr


@pytest.mark.slow
async def test_forget_on_a_terminal_asks_and_no_keeps_the_episode(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (config, listening):
        eid = (await ingest(listening, tmp_path / "state", [run_record()]))[0]["episode_id"]

        def answer(reply: bytes) -> tuple[int, bytes]:
            pid, fd = pty.fork()
            if pid == 0:  # the child: the CLI on a terminal
                os.execv(sys.executable, [sys.executable, "-m", "memactors.cli", "memory", "forget", eid,
                                          "--config", str(config)])
            out = b""
            while b"[y/N]" not in out:
                out += os.read(fd, 1024)
            os.write(fd, reply)
            out = read_terminal(fd, out)
            return os.waitpid(pid, 0)[1], out

        status, out = await trio.to_thread.run_sync(answer, b"n\n")
        assert os.waitstatus_to_exitcode(status) == 1 and b"not forgotten" in out
        shown = await arun_cli(config, "memory", "episodes", eid, "--json")
        assert json.loads(shown.stdout)["forgotten_at"] is None
        status, out = await trio.to_thread.run_sync(answer, b"y\n")
        assert os.waitstatus_to_exitcode(status) == 0 and f"forgotten {eid}".encode() in out


# -- runs ingest -------------------------------------------------------------------------------------------

def test_ingest_sources_expand_directories_recursively_and_keep_stdin(tmp_path: Path) -> None:
    (tmp_path / "d" / "deep").mkdir(parents=True)
    for name in ("d/b.json", "d/a.json", "d/deep/c.json", "d/notes.txt"):
        (tmp_path / name).write_text("{}")
    got = list(cli_runs.ingest_sources([str(tmp_path / "d"), "-", str(tmp_path / "x.json")]))
    assert got == [str(tmp_path / "d/a.json"), str(tmp_path / "d/b.json"), str(tmp_path / "d/deep/c.json"), "-",
                   str(tmp_path / "x.json")]


def test_stdin_parses_one_record_json_lines_or_records_back_to_back() -> None:
    assert cli_runs.split_json_stream('{\n  "a": 1\n}\n', final=True) == ([{"a": 1}], "", [])
    assert cli_runs.split_json_stream('{"a": 1}\n{"a": 2}\n{"a"', final=False) == ([{"a": 1}, {"a": 2}], '{"a"', [])
    assert cli_runs.split_json_stream('{"a": 1}\nnot json\n{"b"', final=True) == ([{"a": 1}], "", ["not json", '{"b"'])
    deep = "[" * 100_000 + "]" * 100_000
    values, rest, bad = cli_runs.split_json_stream(deep + '\n{"a": 2}\n', final=True)
    assert values == [cli_runs._TOO_DEEP, {"a": 2}] and rest == "" and bad == []


@pytest.mark.slow
async def test_runs_ingest_takes_files_directories_and_stdin_and_prints_one_summary(tmp_path: Path) -> None:
    records = tmp_path / "records"
    (records / "nested").mkdir(parents=True)
    for i in range(4):
        target = records / ("nested" if i % 2 else "") / f"run-{i}.json"
        target.write_text(json.dumps(run_record(run_id=str(i))))
    (records / "broken.json").write_text("{not json")
    (records / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (records / "bad-time.json").write_text(json.dumps(run_record(run_id="9", started_at="yesterday")))
    lines = "\n".join(json.dumps(run_record(run_id=str(i))) for i in (3, 10, 11)) + "\n"
    async with daemon_in_process(tmp_path) as (config, _):
        done = await arun_cli(config, "runs", "ingest", str(records), str(EXAMPLES / "run-42-api-fixer.json"),
                              "-", str(tmp_path / "missing.json"), stdin=lines)
        assert done.returncode == 1, done.stderr
        assert acknowledged(done.stdout.splitlines()) == [
            "12 record(s): 7 recorded, 1 duplicate, 0 skipped, 4 rejected"]
        rejected = [line for line in done.stderr.splitlines() if line.startswith("rejected ")]
        assert len(rejected) == 4
        assert any("broken.json: not valid JSON" in line for line in rejected)
        assert any("deep.json: JSON nested too deeply" in line for line in rejected)
        assert any("bad-time.json" in line and "started_at" in line for line in rejected)
        assert any("missing.json" in line and "No such file" in line for line in rejected)
        assert "\r" not in done.stderr  # no progress bar when stderr is not a terminal
        assert re.search(r"^12 record\(s\) in [0-9.]+ s: [0-9]+ records/s$", done.stderr, re.M), done.stderr
        as_json = await arun_cli(config, "runs", "ingest", str(records / "run-0.json"), "--json")
        assert [r["outcome"] for r in json.loads(as_json.stdout)] == ["duplicate"]
        rate = json.loads(as_json.stderr.splitlines()[-1])  # the rate: one JSON object on stderr
        assert rate["records"] == 1 and rate["records_per_s"] == pytest.approx(1 / rate["seconds"], rel=0.05)


@pytest.mark.slow
async def test_runs_ingest_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"run-{i}.json").write_text(json.dumps(run_record(run_id=str(i))))
    async with daemon_in_process(tmp_path) as (config, _):
        def on_a_terminal() -> tuple[int, str, str]:
            main, secondary = pty.openpty()
            with subprocess.Popen([sys.executable, "-m", "memactors.cli", "runs", "ingest",
                                   *(str(tmp_path / f"run-{i}.json") for i in range(3)), "--config", str(config)],
                                  stdout=subprocess.PIPE, stderr=secondary, text=True) as proc:
                os.close(secondary)
                err = read_terminal(main)
                out = proc.stdout.read() if proc.stdout else ""
                code = proc.wait()
            os.close(main)
            return code, out, err.decode()

        code, out, err = await trio.to_thread.run_sync(on_a_terminal)
    assert code == 0, err
    assert "3/3" in err and "[" in err and "#" in err
    # recorded, or queued when the provider was slower than provider_timeout (a loaded machine): either
    # way acknowledged; nothing duplicate, skipped or rejected
    assert out.startswith("3 record(s): ") and out.strip().endswith("0 duplicate, 0 skipped, 0 rejected"), out


@pytest.mark.slow
async def test_ctrl_c_during_runs_ingest_exits_130_with_a_one_line_summary(tmp_path: Path) -> None:
    """Records stream in on stdin; once the CLI's own progress line (stderr on a terminal) shows both
    recorded, SIGINT: exit 130, one summary line with the counts so far, no traceback."""
    async with daemon_in_process(tmp_path) as (config, _):
        def interrupt_mid_ingest() -> tuple[int, str]:
            main, secondary = pty.openpty()
            with subprocess.Popen([sys.executable, "-m", "memactors.cli", "runs", "ingest", "-", "--config",
                                   str(config)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=secondary) as proc:
                os.close(secondary)
                assert proc.stdin is not None
                for i in (1, 2):
                    proc.stdin.write((json.dumps(run_record(run_id=str(i))) + "\n").encode())
                proc.stdin.flush()
                err = b""
                # The CLI has the daemon's answers for both ("2 records recorded 2", or "recorded 1 queued 1"
                # when the provider was slow): wait on its state, under a deadline that fails, not hangs.
                while b"2 records" not in err:
                    if not select.select([main], [], [], 60)[0]:
                        proc.kill()
                        raise AssertionError(f"no progress line for 2 records within 60 s: {err!r}")
                    err += os.read(main, 4096)
                proc.send_signal(signal.SIGINT)
                err = read_terminal(main, err)
                code = proc.wait(timeout=60)
            os.close(main)
            return code, err.decode()

        code, err = await trio.to_thread.run_sync(interrupt_mid_ingest)
    assert code == 130
    after_bar = err.rsplit("\x1b[K", 1)[-1].replace("\r", "").strip()  # what is left once the bar is cleared
    assert acknowledged(after_bar.splitlines()) == [
        "memactors: interrupted after 2 record(s): 2 recorded, 0 duplicate, 0 skipped, 0 rejected"]
    assert "Traceback" not in err


# -- memory episodes: pages -----------------------------------------------------------------------------------

@pytest.mark.slow
async def test_memory_episodes_pages_with_a_total_and_a_cursor(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (config, listening):
        await ingest(listening, tmp_path / "state", [
            run_record(run_id=str(i), started_at=f"2026-11-28T09:0{i}:00Z", ended_at=f"2026-11-28T09:1{i}:00Z")
            for i in range(5)])
        seen: list[str] = []
        after: list[str] = []
        while True:
            page = json.loads((await arun_cli(config, "memory", "episodes", "--limit", "2", "--json", *after)).stdout)
            assert page["total"] == 5
            seen += [e["run_id"] for e in page["episodes"]]
            if page["next_cursor"] is None:
                break
            after = ["--after", page["next_cursor"]]
        assert seen == ["4", "3", "2", "1", "0"]  # newest first, each once
        text = await arun_cli(config, "memory", "episodes", "--limit", "2")
        assert text.returncode == 0
        last = text.stdout.strip().splitlines()[-1]
        assert last.startswith("-- 2 shown of 5; next page: --after ")
        cursor = last.rsplit(" ", 1)[1]
        nxt = await arun_cli(config, "memory", "episodes", "--limit", "2", "--after", cursor)
        assert "2" in _listed_runs(nxt.stdout) and "4" not in _listed_runs(nxt.stdout)


def _listed_runs(stdout: str) -> list[str]:
    """The RUN column of `memory episodes`' table (columns two or more spaces apart)."""
    lines = [line for line in stdout.splitlines() if line and not line.startswith("-- ")]
    assert lines[0].split()[:5] == ["EPISODE", "STARTED", "HARNESS", "RUN", "OUTCOME"], stdout
    return [re.split(r"\s{2,}", line)[3] for line in lines[1:]]


# -- --repo and --as: no silent scope mismatches --------------------------------------------------------------

def test_repo_values_users_type_are_read_as_the_repository_key() -> None:
    from memactors.repo import match_repo

    known = ["forge.example/acme/api", "forge.example/acme/billing", "forge.example/other/api"]
    for typed in ("https://forge.example/acme/api", "https://forge.example/acme/api.git",
                  "git@forge.example:acme/api.git", "forge.example/acme/api/"):
        assert match_repo(typed, known)["key"] == API, typed
    assert match_repo("acme/billing", known) == {"given": "acme/billing", "key": "forge.example/acme/billing",
                                                 "status": "suffix"}
    ambiguous = match_repo("api", known)
    assert ambiguous["status"] == "unknown" and set(ambiguous["close"]) >= {API, "forge.example/other/api"}
    typo = match_repo("forge.example/acme/apii", known)
    assert typo["status"] == "unknown" and typo["close"][0] == API


@pytest.mark.slow
async def test_recall_with_a_url_finds_the_episodes_and_an_unknown_repo_is_named(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (config, listening):
        await ingest(listening, tmp_path / "state", [run_record(result_text="fixed the flaky ledger rounding")])
        for typed in ("https://forge.example/acme/api.git", "git@forge.example:acme/api.git", "acme/api"):
            hit = await arun_cli(config, "memory", "recall", "ledger rounding", "--repo", typed, "--json")
            assert hit.returncode == 0, hit.stderr
            assert [e["repo"] for e in json.loads(hit.stdout)["episodes"]] == [API], typed
            assert f"read as {API}" in hit.stderr
        miss = await arun_cli(config, "memory", "recall", "ledger", "--repo", "forge.example/acme/apii")
        assert f"no episodes in repository forge.example/acme/apii; close known ones: {API}" in miss.stderr
        listed = await arun_cli(config, "memory", "episodes", "--repo", "https://forge.example/acme/api")
        assert _listed_runs(listed.stdout) == ["1"]
        as_unknown = await arun_cli(config, "memory", "recall", "ledger", "--as", "api-fixer")
        assert as_unknown.returncode == 5
        assert "--as api-fixer needs a [harness.api-fixer] table" in as_unknown.stderr
        assert '[harness.api-fixer]\n  harness = "claude-code"' in as_unknown.stderr


# -- start-up cost -----------------------------------------------------------------------------------------------

HEAVY = ("mcp", "memactors.service", "memactors.daemon", "memactors.store", "sqlite_utils", "jsonschema",
         "hypercorn", "httpx2", "prometheus_client")


@pytest.mark.parametrize("argv", [["--help"], ["memory", "status"], ["memory", "episodes"],
                                  ["memory", "recall", "x", "--repo", "r"], ["runs", "ingest", "-"]])
def test_commands_import_only_what_they_need(argv: list[str], tmp_path: Path) -> None:
    """No command loads the service, the store or the MCP SDK (what made `memactors --help` take
    seconds); `--help` and the one-call read commands do not even load trio."""
    probe = (
        "import sys\nfrom memactors import cli\n"
        "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}))\n"
        "print('trio' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv, "--config", str(write_config(tmp_path))]
                          if argv != ["--help"] else [sys.executable, "-c", probe, *argv],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    heavy, trio_loaded = done.stdout.strip().splitlines()[-2:]
    assert heavy == "[]", done.stdout
    if argv[0] != "runs":  # one call each: the standard-library websocket client, not trio's
        assert trio_loaded == "False"


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run the CLI with its stdout a terminal (a pty); its exit code and what the terminal showed."""
    main, secondary = pty.openpty()
    with subprocess.Popen([sys.executable, "-m", "memactors.cli", *argv], stdout=secondary,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as proc:
        os.close(secondary)
        out = read_terminal(main)
        code = proc.wait()
    os.close(main)
    return code, out.decode().replace("\r\n", "\n")


@pytest.mark.slow
async def test_recall_and_briefing_read_for_people_on_a_terminal_and_for_agents_raw_or_piped(tmp_path: Path) -> None:
    """On a terminal `memory recall` and `memory briefing` print a few lines per item (date,
    harness, outcome, what was done, files, one provenance line), no nonce or 300-character provenance
    lines; `--raw` and a pipe print the agent's document byte for byte; `--json` as before."""
    uuid, sha = "0b7f2c8e-3c1d-4e4b-9a55-2f3e1d6c7b8a", "c9c2256e4555a5bdb8e55c606db2b512ca388b6f"
    async with daemon_in_process(tmp_path, '[harness.api-fixer]\nharness = "claude-code"\nmemory_briefing = true\n') \
            as (config, listening):
        results = await ingest(listening, tmp_path / "state", [
            run_record(run_id=uuid, result_text="fixed the ledger rounding with Decimal quantize",
                       events=[{"kind": "edit", "session_id": "s1", "path": "ledger.py", "at": "2026-11-28T09:05:00Z"}]),
            run_record(run_id=sha, harness="imported", adapter="git", outcome="failed", reason="exit_nonzero",
                       result_text="could not reproduce the ledger rounding"),
            run_record(run_id="7", result_text="unrelated webhook work")])
        assert all(r["outcome"] in ("recorded", "queued") for r in results), results
        argv = ["memory", "recall", "ledger rounding", "--repo", API, "--config", str(config)]
        code, human = await trio.to_thread.run_sync(_on_a_terminal, argv)
        raw = await arun_cli(config, *argv[:-2], "--raw")
        piped = await arun_cli(config, *argv[:-2])
        as_json = await arun_cli(config, *argv[:-2], "--json")
        code_b, brief = await trio.to_thread.run_sync(
            _on_a_terminal, ["memory", "briefing", "api-fixer", "--config", str(config)])
        listed = await trio.to_thread.run_sync(
            _on_a_terminal, ["memory", "episodes", "--config", str(config)])
    assert code == 0 and code_b == 0, human
    document = json.loads(as_json.stdout)["document"]
    def nonce_free(text: str) -> str:  # each recall has its own nonce; the rest is the same document
        return re.sub(r'nonce="[^"]+"|memory-data-[0-9a-f]+|[0-9a-f]{24,}', "N", text)

    assert raw.stdout.startswith("<memory-data") and nonce_free(raw.stdout) == nonce_free(piped.stdout)
    assert nonce_free(raw.stdout) == nonce_free(document + "\n")
    assert "nonce" not in human and "<memory-data" not in human and document not in human
    assert "Episodes (" in human and "fixed the ledger rounding with Decimal quantize" in human
    assert "api-fixer  succeeded" in human and "failed" in human and "2026-11-28 09:00 UTC (" in human
    assert f"run {uuid}" in human and f"run {sha}" in human and "  files: ledger.py" in human
    assert max(len(line) for line in human.splitlines()) < 160  # no 300-character provenance lines
    assert "Briefing for api-fixer" in brief and "<memory-data" not in brief
    # `memory episodes`: every column starts at the same place whatever the run id's length.
    rows = [line for line in listed[1].splitlines() if line.strip() and not line.startswith("-- ")]
    starts = {(line.index(" 2026-") if " 2026-" in line else -1) for line in rows[1:]}
    header = rows[0]
    assert len(starts) == 1, listed[1]
    for column in ("OUTCOME", "REPOSITORY"):
        at = header.index(column)
        assert all(line[at - 2:at] == "  " and line[at] != " " for line in rows[1:]), listed[1]
