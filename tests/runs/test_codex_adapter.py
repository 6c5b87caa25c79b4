"""The codex adapter: argv and environment for ``codex exec --json``, and its parser on recorded streams;
the fake Responses API tried with the real Codex CLI the way a new user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fix_agents import codex_bin, codex_env, fake_provider_args, run_codex
from memactors.adapters import LaunchRequest
from memactors.adapters.codex import CodexAdapter, CodexParser, unwrap_shell
from memactors.testing.fake_openai import Message, PatchCall, ShellCall, Turn, run_fake_openai
from support_runs import PYTEST

DATA = Path(__file__).resolve().parents[1] / "data"
AT = "2026-11-30T12:00:00Z"


def _parse(name: str) -> CodexParser:
    parser = CodexAdapter().parser()
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        parser.feed(line, at=AT)
    return parser


def _request(**kw: object) -> LaunchRequest:
    base: dict[str, object] = {"harness": "coder", "run_id": "r1", "workdir": "/w", "prompt": "-fix the test",
                               "command": None}
    return LaunchRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_launch_puts_the_prompt_last_after_a_double_dash_so_a_leading_dash_is_not_an_option() -> None:
    spec = CodexAdapter().launch(_request(model="gpt-5.5", extra_args=("--color", "never")))
    assert spec.argv[:4] == ("codex", "exec", "--json", "--skip-git-repo-check")
    assert spec.argv[4:6] == ("-m", "gpt-5.5")
    assert spec.argv[-2:] == ("--", "-fix the test")
    assert spec.argv[-4:-2] == ("--color", "never")


def test_launch_gives_the_gateway_as_an_mcp_server_with_the_token_only_in_the_environment() -> None:
    token = "tok-" + "x" * 40
    spec = CodexAdapter().launch(_request(command="/opt/codex", gateway_url="http://127.0.0.1:9/mcp", run_token=token,
                                          mcp_config_path="/state/runs/r1.mcp.json", permission_mode="workspace-write"))
    assert spec.argv[0] == "/opt/codex"
    assert ("-s", "workspace-write") == spec.argv[4:6]
    overrides = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "-c"]
    assert 'mcp_servers.memactors.url="http://127.0.0.1:9/mcp"' in overrides
    assert 'mcp_servers.memactors.bearer_token_env_var="MEMACTORS_RUN_TOKEN"' in overrides
    # codex exec's approval policy is "never": without this every recall/briefing call is refused
    assert 'mcp_servers.memactors.default_tools_approval_mode="approve"' in overrides
    assert not any(token in a for a in spec.argv)  # argv is visible to every local user through ps
    assert spec.env == {"MEMACTORS_GATEWAY_URL": "http://127.0.0.1:9/mcp", "MEMACTORS_RUN_TOKEN": token,
                        "MEMACTORS_MCP_CONFIG": "/state/runs/r1.mcp.json"}


def test_launch_without_a_prompt_or_gateway_has_neither() -> None:
    spec = CodexAdapter().launch(_request(prompt=None))
    assert spec.argv == ("codex", "exec", "--json", "--skip-git-repo-check")
    assert spec.env == {}


def test_parser_reads_thread_commands_file_changes_mcp_calls_and_the_final_message() -> None:
    parser = _parse("codex_exec_session.jsonl")
    tr = parser.transcript
    assert tr.session_id == "01a22e71-df64-7b20-a6ab-96143c8a9e58"
    assert tr.result_ok is True and tr.result_kind == "completed"
    assert tr.result_text == "Added notes.txt; the ledger test still fails."
    assert [(c.command, c.exit_code) for c in tr.commands] == [("python -m pytest -q test_x.py", 1)]
    # the failed patch wrote nothing, so it is no edit
    assert [e.path for e in tr.edits] == ["/var/tmp/work/notes.txt", "/var/tmp/work/ledger.py"]
    assert all(e.at == AT for e in tr.edits)
    assert tr.tool_calls == ["mcp__memactors__recall", "command_execution", "file_change", "file_change"]
    assert parser.usage == {"input_tokens": 300, "cached_input_tokens": 10, "output_tokens": 60}
    assert tr.cost_usd is None  # Codex reports tokens, not money
    # each model message is a turn and a text (what `runs logs` shows of a Codex run)
    assert (tr.turns, tr.texts, tr.last_text) == (1, 1, "Added notes.txt; the ledger test still fails.")


def test_parser_keeps_no_command_output_reasoning_or_tool_results() -> None:
    parser = _parse("codex_exec_session.jsonl")
    kept = repr(parser.transcript) + repr(parser.usage)
    for secret in ("SECRET-COMMAND-OUTPUT", "SECRET-REASONING", "SECRET-RECALL-BODY", "ledger test\""):
        assert secret not in kept


def test_parser_reports_a_failed_turn_and_survives_malformed_lines() -> None:
    parser = _parse("codex_exec_failed.jsonl")
    tr = parser.transcript
    assert tr.session_id == "01a22e72-0000-7000-8000-000000000001"
    assert tr.result_ok is False and tr.result_kind == "turn_failed"
    assert [(c.command, c.exit_code) for c in tr.commands] == [("cargo test", None)]
    assert parser.unparsed == 3  # a non-JSON line, a JSON array, a command that is not a string
    assert tr.result_text is None


def test_a_later_completed_turn_overrides_a_stream_error_codex_recovered_from() -> None:
    parser = CodexParser()
    for line in ('{"type":"error","message":"Reconnecting... 1/5"}',
                 '{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":1}}'):
        parser.feed(line, at=AT)
    assert parser.transcript.result_ok is True


@pytest.mark.parametrize(("command", "expected"), [
    ("/bin/bash -lc 'python -m pytest -q'", "python -m pytest -q"),
    ("bash -c 'go test ./...'", "go test ./..."),
    ("npm test", "npm test"),
    ("bash -lc 'unterminated", "bash -lc 'unterminated"),
])
def test_unwrap_shell_drops_codexs_login_shell_wrapper(command: str, expected: str) -> None:
    assert unwrap_shell(command) == expected


@pytest.mark.slow
async def test_real_codex_cli_runs_a_scripted_session_against_the_fake_responses_api(tmp_path: Path) -> None:
    codex = codex_bin()
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_ledger.py").write_text("def test_ledger():\n    assert 1 + 1 == 3\n", encoding="utf-8")
    script = [
        Turn([ShellCall(["bash", "-lc", f"{PYTEST} test_ledger.py"])]),
        Turn([PatchCall("*** Begin Patch\n*** Add File: notes.txt\n+the ledger test fails\n*** End Patch\n")]),
        Turn([Message("Wrote notes.txt; the ledger test still fails.")], input_tokens=400, output_tokens=30),
    ]
    async with run_fake_openai(script) as fake:
        argv = [str(codex), "exec", "--json", "--skip-git-repo-check", "-s", "workspace-write",
                *fake_provider_args(fake.base_url), "Look at the ledger test and leave a note."]
        done = await run_codex(argv, cwd=work, env=codex_env(tmp_path / "codex-home"))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    events = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    types = [e["type"] for e in events]
    assert types[0] == "thread.started" and types[-1] == "turn.completed"
    assert (work / "notes.txt").read_text(encoding="utf-8") == "the ledger test fails\n"
    # the fake recorded what the CLI sent: the prompt, the offered tools, the tool outputs it returned
    assert len(fake.model_calls) == 3
    assert "Look at the ledger test" in fake.first_user_text()
    assert {"exec_command", "apply_patch"} <= set(fake.tool_names())
    assert all(c.authorization == "Bearer sk-fake-key" for c in fake.model_calls)
    outputs = [i for i in fake.model_calls[1].body["input"] if i.get("type") == "function_call_output"]
    assert "exited with code 1" in outputs[0]["output"] and "1 failed" in outputs[0]["output"]  # pytest ran
    # and the adapter's parser reads the real stream into the run's observations
    parser = CodexAdapter().parser()
    for line in done.stdout.decode().splitlines():
        parser.feed(line, at=AT)
    tr = parser.transcript
    assert tr.result_ok is True and tr.result_text == "Wrote notes.txt; the ledger test still fails."
    assert [(c.command, c.exit_code) for c in tr.commands] == [(f"{PYTEST} test_ledger.py", 1)]
    assert [Path(e.path).name for e in tr.edits] == ["notes.txt"]
    assert parser.usage["input_tokens"] == 100 + 100 + 400
