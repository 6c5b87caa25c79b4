"""Adapters on recorded streams (no process), the run record built from a transcript, and the run keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memactors._wire import parse_run_record
from memactors.adapters import CommandRun, FileEdit, LaunchRequest, Transcript, get_adapter
from memactors.adapters.claude_code import ClaudeCodeAdapter
from memactors.adapters.command import TAIL_CHARS, CommandAdapter
from memactors.agents.run_record import build_run_record
from memactors.config import DEFAULT_VERIFY_PATTERNS, HarnessConfig, load_config
from memactors.errors import ConfigError, InvalidArgument
from support import write_config

DATA = Path(__file__).resolve().parents[1] / "data"
AT = "2026-11-30T10:00:00.000000Z"


def request(**overrides: object) -> LaunchRequest:
    fields: dict[str, object] = dict(harness="h", run_id="r1", workdir="/w", prompt="do it", command=None)
    fields.update(overrides)
    return LaunchRequest(**fields)  # type: ignore[arg-type]


def test_claude_code_argv_always_allows_the_memory_tools() -> None:
    spec = ClaudeCodeAdapter().launch(request(
        allowed_tools=("Edit", "Bash(pytest:*)"), permission_mode="acceptEdits", model="claude-x",
        extra_args=("--max-turns", "5"), mcp_config_path="/state/runs/mcp-1.json"))
    assert spec.argv == (
        "claude", "-p", "--output-format", "stream-json", "--verbose",
        "--mcp-config", "/state/runs/mcp-1.json", "--permission-mode", "acceptEdits", "--model", "claude-x",
        "--allowedTools", "Edit", "Bash(pytest:*)", "mcp__memactors__recall", "mcp__memactors__briefing",
        "--max-turns", "5", "--", "do it")


def test_claude_code_parser_reads_a_real_stream() -> None:
    """The stream the real claude 2.1 printed against the fake API: Write, a failing Bash, a final answer."""
    parser = ClaudeCodeAdapter().parser()
    for line in (DATA / "claude_stream_session.jsonl").read_text(encoding="utf-8").splitlines():
        parser.feed(line, at=AT)
    t = parser.transcript
    assert t.session_id == "7f6ebf4c-3594-4ecb-beff-d2840e11bf7d"
    assert t.model == "claude-fake-1"  # served by the API (init asked for claude-opus-5-5)
    assert t.edits == [FileEdit("/tmp/cx/repo/hello.txt", AT)]
    assert t.commands == [CommandRun("python3 -m pytest -q", 5, AT)]
    assert t.tool_calls == ["Write", "Bash"]
    assert (t.result_ok, t.result_kind, t.result_text) == (True, "success", "All done: wrote hello.txt")
    assert t.cost_usd == pytest.approx(0.00288)


def test_claude_code_parser_skips_garbage_and_reads_an_error_result() -> None:
    parser = ClaudeCodeAdapter().parser()
    for line in ("not json", "[1, 2]", "{broken", json.dumps({"type": "result", "subtype": "error_max_turns",
                                                              "is_error": True, "duration_ms": 12})):
        parser.feed(line, at=AT)
    t = parser.transcript
    assert (t.result_ok, t.result_kind, t.duration_ms, t.cost_usd) == (False, "error_max_turns", 12, None)


def test_command_adapter_fills_the_template_and_keeps_only_the_tail() -> None:
    adapter = CommandAdapter()
    assert adapter.launch(request(command="agent --task '{prompt}' -v")).argv == ("agent", "--task", "do it", "-v")
    assert adapter.launch(request(command="agent -v", extra_args=("--x",))).argv == ("agent", "-v", "--x", "do it")
    with pytest.raises(InvalidArgument, match="command is required"):
        adapter.launch(request(command=None))
    parser = adapter.parser()
    for i in range(2000):
        parser.feed(f"line {i}", at=AT)
    text = parser.transcript.result_text
    assert text is not None and text.endswith("line 1999") and len(text) <= TAIL_CHARS
    assert "line 0\n" not in text


def test_registry_knows_the_adapters_and_names_an_unknown_one() -> None:
    assert get_adapter("claude-code").name == "claude-code"
    assert get_adapter("command").name == "command"
    with pytest.raises(InvalidArgument, match="'aider': no adapter"):
        get_adapter("aider")


def cfg(**overrides: object) -> HarnessConfig:
    return HarnessConfig(name="h", harness="claude-code", origin="global", **overrides)  # type: ignore[arg-type]


def record(transcript: Transcript, **overrides: object) -> dict[str, object]:
    fields: dict[str, object] = dict(
        harness="h", adapter="claude-code", run_id="r1", cfg=cfg(), transcript=transcript, exit_code=0,
        stopped=None, spawn_error=False, started_at=AT, ended_at=AT, duration_ms=5, workdir="/repo/src",
        repo_key="forge.example/acme/api", toplevel="/repo", branch="main", changed={"src/a.py", "b.py"})
    fields.update(overrides)
    data = build_run_record(**fields)  # type: ignore[arg-type]
    parse_run_record(data)  # always a valid record
    return data


def test_run_record_edits_are_tool_writes_confirmed_by_git_plus_shell_writes() -> None:
    t = Transcript(edits=[FileEdit("/repo/src/a.py", AT), FileEdit("a.py", AT), FileEdit("/repo/gone.py", AT)])
    data = record(t, changed={"src/a.py", "b.py", "build/"}, dirty_at_start=frozenset({"c.py"}))
    assert [e["path"] for e in data["events"] if e["kind"] == "edit"] == ["src/a.py", "b.py"]


def test_run_record_verify_events_and_outcome_follow_the_last_test_command() -> None:
    t = Transcript(commands=[CommandRun("python -m pytest -q", 1, AT), CommandRun("ls", 0, AT),
                             CommandRun("cd x && go test ./...", 0, AT)], result_ok=True)
    data = record(t)
    verify = [(e["ok"], e["error_class"]) for e in data["events"] if e["kind"] == "verify"]
    assert verify == [(False, "test_failure"), (True, None)]
    assert (data["outcome"], data["reason"]) == ("succeeded", "completed")
    failing = record(Transcript(commands=[CommandRun("npm test", 2, AT)], result_ok=True))
    assert (failing["outcome"], failing["reason"]) == ("failed", "verify_failed")


@pytest.mark.parametrize(("overrides", "transcript", "expected"), [
    ({"spawn_error": True, "exit_code": None}, Transcript(), ("crashed", "spawn_error")),
    ({"stopped": "deadline", "exit_code": -15}, Transcript(), ("timed_out", "deadline")),
    ({"stopped": "operator_cancel", "exit_code": -15}, Transcript(), ("cancelled", "operator_cancel")),
    ({"stopped": "cancel", "exit_code": -15}, Transcript(), ("cancelled", "operator_cancel")),
    ({"stopped": "max_turns", "exit_code": -15}, Transcript(), ("cancelled", "budget_exceeded")),
    ({"stopped": "max_cost_usd", "exit_code": 0}, Transcript(result_ok=True), ("cancelled", "budget_exceeded")),
    ({"exit_code": -9}, Transcript(), ("crashed", "signal")),
    ({"exit_code": 1, "output": False}, Transcript(), ("failed", "launch_failed")),
    ({"exit_code": 0, "output": False}, Transcript(), ("succeeded", "completed")),  # quiet, not failed
    ({"exit_code": 1}, Transcript(result_ok=False, result_kind="error_max_turns"), ("failed", "budget_exceeded")),
    ({"exit_code": 0}, Transcript(result_ok=False, result_kind="error_during_execution"), ("failed", "exit_nonzero")),
    ({"exit_code": 2}, Transcript(), ("failed", "exit_nonzero")),
    ({}, Transcript(result_ok=True), ("succeeded", "completed")),
])
def test_run_record_outcome_and_reason(overrides: dict[str, object], transcript: Transcript,
                                       expected: tuple[str, str]) -> None:
    data = record(transcript, **overrides)
    assert (data["outcome"], data["reason"]) == expected
    assert data["trigger"] == {"source": "operator", "name": "memactors run"}
    assert data["prompt"] is None
    assert data["spawned_process"] is (overrides.get("spawn_error") is not True)


def test_run_record_carries_model_cost_and_the_primary_session() -> None:
    t = Transcript(session_id="s-1", model="claude-x", cost_usd=0.5, result_text="done", result_ok=True)
    data = record(t, cfg=cfg(model="claude-pinned"))
    assert data["model"] == {"served": "claude-x", "pinned": None, "configured": "claude-pinned"}
    assert (data["cost_usd"], data["cost_source"], data["result_text"]) == (0.5, "reported", "done")
    assert data["sessions"] == [{"session_id": "s-1", "subagent": False, "cwd": "/repo/src",
                                 "repo": "forge.example/acme/api", "git_branch": "main", "started_at": AT}]


def test_run_keys_load_with_defaults(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[harness.a]\nharness = "claude-code"\n'
                                  '[harness.b]\nharness = "command"\ncommand = "x {prompt}"\ntimeout = "2s"\n'
                                  'allowed_tools = ["Edit"]\nextra_args = ["-v"]\nverify_patterns = ["make check"]\n'
                                  'permission_mode = "acceptEdits"\nmodel = "m"\n')
    config = load_config(path, env={"HOME": str(tmp_path)})
    a, b = config.harness["a"], config.harness["b"]
    assert (a.timeout, a.timeout_text, a.verify_patterns, a.command) == (1800.0, "30m", DEFAULT_VERIFY_PATTERNS, None)
    assert (b.timeout, b.allowed_tools, b.extra_args, b.verify_patterns) == (2.0, ("Edit",), ("-v",), ("make check",))
    assert (b.permission_mode, b.model, b.command) == ("acceptEdits", "m", "x {prompt}")
    assert config.global_path == path


@pytest.mark.parametrize(("line", "key", "value"), [
    ('timeout = "soon"', "[harness.a] timeout", "soon"),
    ('timeout = "0s"', "[harness.a] timeout", "0s"),
    ('verify_patterns = ["(unclosed"]', "[harness.a] verify_patterns", "(unclosed"),
    ('allowed_tools = "Edit"', "[harness.a] allowed_tools", "Edit"),
    ('command = " "', "[harness.a] command", " "),
    ("model = 3", "[harness.a] model", 3),
])
def test_bad_run_keys_name_file_key_and_value(tmp_path: Path, line: str, key: str, value: object) -> None:
    path = write_config(tmp_path, f'[harness.a]\nharness = "claude-code"\n{line}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={"HOME": str(tmp_path)})
    assert err.value.context["key"] == key
    assert err.value.context["value"] == value
    assert str(path) in str(err.value)


@pytest.mark.parametrize(("line", "key", "value", "says"), [
    ("max_turns = 0", "[harness.a] max_turns", 0, "must be 1 to 10000"),
    ('max_turns = "5"', "[harness.a] max_turns", "5", "must be an integer"),
    ("max_turns = 1_000_000", "[harness.a] max_turns", 1_000_000, "must be 1 to 10000"),
    ("max_cost_usd = 0", "[harness.a] max_cost_usd", 0, "must be a number of US dollars above 0"),
    ("max_cost_usd = -2.5", "[harness.a] max_cost_usd", -2.5, "must be a number of US dollars above 0"),
    ('max_cost_usd = "1"', "[harness.a] max_cost_usd", "1", "must be a number of US dollars above 0"),
    ("max_cost_usd = inf", "[harness.a] max_cost_usd", float("inf"), "must be a number of US dollars above 0"),
])
def test_bad_caps_name_the_key_and_the_value(tmp_path: Path, line: str, key: str, value: object, says: str) -> None:
    path = write_config(tmp_path, f'[harness.a]\nharness = "claude-code"\n{line}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={"HOME": str(tmp_path)})
    assert (err.value.context["key"], err.value.context["value"]) == (key, value)
    assert says in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("adapter", ["codex", "command"])
@pytest.mark.parametrize(("cap", "value"), [("max_turns", "3"), ("max_cost_usd", "1.5")])
def test_a_cap_the_adapter_cannot_enforce_fails_config_load(tmp_path: Path, adapter: str, cap: str,
                                                            value: str) -> None:
    """A cap that would silently do nothing is refused at load, naming the key, the value and the adapter."""
    path = write_config(tmp_path, f'[harness.a]\nharness = "{adapter}"\ncommand = "x"\n{cap} = {value}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={"HOME": str(tmp_path)})
    assert err.value.context["key"] == f"[harness.a] {cap}"
    assert f"{cap} = {value}: the {adapter} adapter cannot enforce it" in str(err.value)
    assert "adapters that can: claude-code" in str(err.value)


def test_caps_load_and_reach_claudes_argv(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[harness.a]\nharness = "claude-code"\nmax_turns = 12\nmax_cost_usd = 2.5\n')
    a = load_config(path, env={"HOME": str(tmp_path)}).harness["a"]
    assert (a.max_turns, a.max_cost_usd) == (12, 2.5)
    argv = ClaudeCodeAdapter().launch(request(max_turns=a.max_turns, max_cost_usd=a.max_cost_usd)).argv
    assert argv[argv.index("--max-turns") + 1] == "12" and argv[argv.index("--max-budget-usd") + 1] == "2.5"
    assert argv[-2:] == ("--", "do it")
