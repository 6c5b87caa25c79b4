"""Episode assembly as pure code (REQ-5, REQ-6 trust class, REQ-8 eligibility) and repository resolution
against real git repositories made in tmp_path."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memactors._wire import episode_json, episode_to_dict, parse_run_record
from memactors.actors.index import text_belongs_body
from memactors.episode import (
    FIELD_ORDER,
    MAX_FIELD_BYTES,
    SessionRepo,
    assemble,
    cut_utf8,
    episode_id_for,
    render_text,
    repo_files,
    repo_relative,
    resolve_sessions,
    skip_reason,
    stored_record,
)
from memactors.models import RunRecord
from memactors.redact import REDACTED, redact
from memactors.repo import GitUnavailable
from memactors.store.episodes import stored_copy
from support import example, run_record

API = "forge.example/acme/api"
GHP = "gh" + "p_" + "Idg53Z131ckMzKyTs2mP" + "Ln6YYc8kkswFm9il"


pytestmark = pytest.mark.usefixtures("isolated_git")


def git_repo(path: Path, *remotes: tuple[str, str]) -> Path:
    """`git init` at `path` with the given remotes; returns the toplevel as git reports it."""
    path.mkdir(parents=True)
    subprocess.run(["git", "-C", str(path), "init", "-q"], check=True)
    for name, url in remotes:
        subprocess.run(["git", "-C", str(path), "remote", "add", name, url], check=True)
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True)
    return Path(done.stdout.strip())


def record(**overrides: Any) -> RunRecord:
    return parse_run_record(run_record(**overrides))


def fixed(rec: RunRecord, key: str | None = API, cwd: str = "/srv/api") -> dict[str, SessionRepo]:
    """Every session resolved to `key` with no checkout (cwd taken as the root): no git involved."""
    return {s.session_id: SessionRepo(key=key, cwd=s.cwd) for s in rec.sessions}


def edit(path: str, session: str = "s1") -> dict[str, Any]:
    return {"kind": "edit", "session_id": session, "at": "2026-11-28T09:01:00Z", "path": path}


def verify(error_class: str | None, session: str = "s1", ok: bool = False) -> dict[str, Any]:
    return {"kind": "verify", "session_id": session, "at": "2026-11-28T09:02:00Z", "ok": ok,
            "error_class": error_class}


# -- REQ-5 --------------------------------------------------------------------------------------------

@pytest.mark.req5
async def test_req5_a_failed_run_yields_a_complete_episode() -> None:
    rec = stored_record(parse_run_record(example("run-42-api-fixer.json")))
    repos = await resolve_sessions(rec)
    assert skip_reason(rec, repos) is None
    ep = assemble(rec, repos, excerpt_chars=600)
    assert ep.files_touched == ("internal/clock/clock.go", "internal/ledger/reconcile.go",
                                "internal/ledger/reconcile_test.go")
    assert [(v.error_class, v.count) for v in ep.verify_failures] == [("test_failure", 2)]
    assert (ep.outcome, ep.reason, ep.repo, ep.branch) == ("failed", "verify_failed", API, "fix/flaky")
    assert ep.scope == f"project:{API}" and ep.trust_class == "standard"
    assert ep.model == "claude-sonnet-4-5" and ep.run_id == "42" and ep.harness == "api-fixer"
    text = render_text(ep)
    assert "verify_failures: test_failure: 2\n" in text
    for rendered in (text, episode_json(ep)):
        assert "Fix the flaky ledger test" not in rendered and "prompt" not in rendered
        assert "never stored" not in rendered  # the tool_call payload


def test_episode_id_is_ep_and_20_hex_of_sha256_over_harness_run_and_started_at() -> None:
    expected = "ep_" + hashlib.sha256(b"api-fixer\x0042\x002026-11-28T09:00:00Z").hexdigest()[:20]
    assert episode_id_for("api-fixer", "42", "2026-11-28T09:00:00Z") == expected
    rec = record(run_id="42")
    assert assemble(rec, fixed(rec), excerpt_chars=10).episode_id == expected


def test_strings_are_cut_to_256_bytes_on_a_utf8_boundary() -> None:
    assert cut_utf8("é" * 200) == "é" * 128
    assert cut_utf8("a" + "é" * 200) == "a" + "é" * 127  # 255 bytes: the next é would split
    rec = record(harness="h" + "€" * 100, trace_id="t" * 300,
                 sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": API, "git_branch": "b/" + "ü" * 200}])
    ep = assemble(rec, fixed(rec), excerpt_chars=10)
    for value in (ep.harness, ep.trace_id, ep.branch):
        assert len(value.encode()) <= MAX_FIELD_BYTES
        assert len(value.encode()) > MAX_FIELD_BYTES - 4
    assert ep.trace_id == "t" * 256


def test_files_are_repository_relative_deduplicated_sorted_and_capped_at_50() -> None:
    paths = [f"src/f{i:03d}.go" for i in range(80, 0, -1)] + ["/srv/api/src/f001.go", "./src/f002.go",
                                                             "/elsewhere/x.go", "../escape.go", "/srv/api"]
    rec = record(events=[edit(p) for p in paths])
    ep = assemble(rec, fixed(rec), excerpt_chars=10)
    assert ep.files_touched == tuple(f"src/f{i:03d}.go" for i in range(1, 51))
    assert len(repo_files(rec, fixed(rec))) == 80  # the graph keeps them all


def test_verify_failures_keep_ten_classes_by_count_then_name() -> None:
    events = [verify(f"class_{c}") for c in "abcdefghijkl" for _ in range(1 + "abcdefghijkl".index(c) % 3)]
    events += [verify(None), verify("passed", ok=True), {"kind": "verify", "session_id": "s1", "at": "2026-11-28T09:03:00Z"}]
    rec = record(events=events)
    ep = assemble(rec, fixed(rec), excerpt_chars=10)
    assert len(ep.verify_failures) == 10
    pairs = [(v.error_class, v.count) for v in ep.verify_failures]
    assert pairs[:4] == [("class_c", 3), ("class_f", 3), ("class_i", 3), ("class_l", 3)]
    assert ("unknown", 1) not in pairs[:8] and all(c != "passed" for c, _ in pairs)


def test_result_excerpt_is_the_first_excerpt_chars_characters() -> None:
    rec = record(result_text="ab\ncdé" * 100)
    assert assemble(rec, fixed(rec), excerpt_chars=7).result_excerpt == "ab cdéa"  # LF is a space (REQ-6)
    assert assemble(rec, fixed(rec), excerpt_chars=0).result_excerpt == ""
    assert assemble(record(result_text=None), fixed(rec), excerpt_chars=9).result_excerpt == ""


def test_a_summary_over_280_characters_is_dropped_not_cut() -> None:
    rec = record()
    assert assemble(rec, fixed(rec), excerpt_chars=9, summary="s" * 280).summary == "s" * 280
    assert assemble(rec, fixed(rec), excerpt_chars=9, summary="s" * 281).summary is None
    assert assemble(rec, fixed(rec), excerpt_chars=9, summary=f"used {GHP}").summary == f"used {REDACTED}"


def test_text_lists_every_field_in_req5_order_one_line_each() -> None:
    rec = record(result_text="line one\nline two\r\n\u2028back\\slash", trace_id="t\u2029x",
                 events=[edit("dir/new\\line.go"), verify("a\nb")])
    ep = assemble(rec, fixed(rec), excerpt_chars=600, pull_request="https://forge.example/acme/api/pull/7")
    lines = render_text(ep).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == list(FIELD_ORDER)
    assert FIELD_ORDER[:4] == ("episode_id", "harness", "adapter", "run_id")
    assert FIELD_ORDER[-3:] == ("summary", "trust_class", "scope")
    # Every run of line breaks (LF, CRLF, U+2028) is one space (REQ-6); nothing is escaped.
    assert "result_excerpt: line one line two back\\slash" in lines
    assert ep.result_excerpt == "line one line two back\\slash" and ep.trace_id == "t x"
    # A path with a line break is refused at the boundary; a backslash is kept as it is.
    assert "files_touched: dir/new\\line.go" in lines and "verify_failures: a b: 1" in lines
    assert "pull_request: https://forge.example/acme/api/pull/7" in lines
    assert "summary: " in lines and "cost_usd: " in lines


def test_the_text_check_reads_the_stored_body_as_it_read_the_rendering() -> None:
    """The store keeps an episode's body alone (migration 0007): the text memory_record_episode sends is
    rendered from it byte for byte, and REQ-9's text check against the body accepts what the rendering
    holds (any line, any snippet, escaped words) and refuses a word the episode does not have."""
    rec = record(result_text="ledger rounding\u2028fixed in cents, café", events=[edit("internal/ledger.go")])
    ep = assemble(rec, fixed(rec), excerpt_chars=600)
    body, text = episode_json(ep), render_text(ep)
    assert stored_copy(body) == (json.loads(body), text)
    for line in text.splitlines():
        assert text_belongs_body(line, body), line
    assert text_belongs_body("…ledger rounding fixed in [cents]…", body)  # the break is a space
    assert ep.result_excerpt == "ledger rounding fixed in cents, café"
    assert text_belongs_body("rounding fixed café", body) and text_belongs_body("", body)
    assert not text_belongs_body("ledger proration", body) and not text_belongs_body("invoice", body)
    # A body whose JSON spells a word differently from the rendering (here ASCII escapes) falls back to
    # the rendering itself: the honest word passes, a foreign one still does not.
    ascii_body = json.dumps(episode_to_dict(ep))
    assert "café" not in ascii_body
    assert text_belongs_body("café", ascii_body) and not text_belongs_body("invoice café", ascii_body)
    assert not text_belongs_body("ledger", '{"not": "an episode"}')  # vouches for nothing but its words


@pytest.mark.req6
def test_every_string_is_redacted_and_control_characters_stripped() -> None:
    rec = record(result_text=f"pushed with {GHP}\x00\x1b[31m ok", trace_id=f"t {GHP}",
                 model={"served": f"m\x07{GHP}"},
                 sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": API, "git_branch": f"b-{GHP}"}],
                 events=[edit(f"src/{GHP}.go"), verify(f"err {GHP}")])
    ep = assemble(rec, fixed(rec), excerpt_chars=600)
    dumped = episode_json(ep) + render_text(ep)
    assert GHP not in dumped and GHP[4:] not in dumped
    assert ep.result_excerpt == f"pushed with {REDACTED} ok"  # the escape sequence goes whole
    assert ep.branch == f"b-{REDACTED}" and ep.files_touched == (f"src/{REDACTED}.go",)
    assert "\x00" not in dumped and "\x1b" not in dumped and "\x07" not in dumped


def test_stored_record_drops_the_prompt_redacts_and_is_idempotent() -> None:
    raw = run_record(prompt="secret plan", result_text=f"t {GHP} \ud800 end")
    once = stored_record(parse_run_record(raw))
    assert once.prompt is None
    assert once.result_text == f"t {REDACTED} \ufffd end"
    assert stored_record(once) == once


# -- REQ-5 "Assembly is reproducible": a property test ----------------------------------------------

_texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40) | st.sampled_from(
    [GHP, f"token {GHP}", "é" * 140, "a\nb\r\u2028c\\d", "\x00\x1f\x7f\x85", "password = Xk9#mP2$vL8qR4nT"])


# harness, adapter, run_id, branch and paths are one line (the boundary rejects control characters
# and line breaks in them); other fields may carry any text.
_ONE_LINE = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]")
_lines = _texts.map(lambda s: _ONE_LINE.sub("", s))


@st.composite
def run_records(draw: st.DrawFn) -> dict[str, Any]:
    sessions = [{"session_id": "s0", "cwd": "/srv/api", "repo": API, "git_branch": draw(_lines)}]
    for i in range(draw(st.integers(0, 2))):
        sessions.append({"session_id": f"s{i + 1}", "cwd": draw(st.sampled_from(["/srv/api/sub", "/srv/other"])),
                         "subagent": True, "repo": draw(st.sampled_from([API, "forge.example/acme/billing"]))})
    event = st.fixed_dictionaries({
        "kind": st.sampled_from(["edit", "verify", "tool_call", "message"]),
        "session_id": st.sampled_from([s["session_id"] for s in sessions] + ["ghost"]),
        "at": st.just("2026-11-28T09:01:00Z"),
        "path": st.none() | _lines | st.sampled_from(["a.go", "/srv/api/b.go", "../c.go", "/srv/api/sub/d.go"]),
        "ok": st.none() | st.booleans(),
        "error_class": st.none() | _texts | st.sampled_from(["test_failure", "lint"]),
    })
    return run_record(
        harness=draw(_lines.filter(bool)), run_id=draw(_lines.filter(bool)), adapter=draw(_lines.filter(bool)),
        trace_id=draw(_texts), result_text=draw(st.none() | _texts), prompt="PROMPT-MARKER " + draw(_texts),
        cost_usd=draw(st.none() | st.floats(0, 1e6)), model={"served": draw(st.none() | _texts)},
        trigger={"source": draw(st.sampled_from(["manual", "webhook", "channel", "api"]))},
        sessions=sessions, events=draw(st.lists(event, max_size=30)),
    )


@pytest.mark.req5
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=run_records(), excerpt=st.integers(0, 2000), inline=st.booleans())
def test_req5_assembly_is_reproducible(raw: dict[str, Any], excerpt: int, inline: bool) -> None:
    def build() -> tuple[str, str]:
        rec = stored_record(parse_run_record(json.loads(json.dumps(raw))))
        repos = {s.session_id: SessionRepo(key=s.repo, cwd=s.cwd) for s in rec.sessions}
        ep = assemble(rec, repos, excerpt_chars=excerpt, untrusted_inline=inline)
        return episode_json(ep), render_text(ep)

    first, second = build(), build()
    assert first == second
    body, text = first
    ep = json.loads(body)
    assert list(ep) == list(FIELD_ORDER)
    assert "prompt" not in ep and "PROMPT-MARKER" not in body and "PROMPT-MARKER" not in text
    assert len(text.splitlines()) == len(FIELD_ORDER)
    assert all(redact(line) == line for line in text.splitlines())
    for name in ("harness", "adapter", "run_id", "trace_id", "model", "repo", "branch", "started_at"):
        assert len(ep[name].encode()) <= MAX_FIELD_BYTES
        assert redact(ep[name]) == ep[name]
    assert len(ep["result_excerpt"]) <= excerpt and redact(ep["result_excerpt"]) == ep["result_excerpt"]
    assert ep["files_touched"] == sorted(ep["files_touched"]) and len(ep["files_touched"]) <= 50
    assert all(redact(f) == f for f in ep["files_touched"])
    assert len(ep["verify_failures"]) <= 10
    assert GHP not in body and GHP not in text
    untrusted = inline or raw["trigger"]["source"] in ("webhook", "channel")
    assert ep["trust_class"] == ("untrusted_input" if untrusted else "standard")


# -- REQ-6 trust class --------------------------------------------------------------------------------

@pytest.mark.req6
@pytest.mark.parametrize(("source", "inline", "expected"), [
    ("webhook", False, "untrusted_input"), ("channel", False, "untrusted_input"),
    ("manual", True, "untrusted_input"), ("schedule", False, "standard"), ("api", False, "standard"),
])
def test_trust_class_follows_trigger_and_untrusted_inline(source: str, inline: bool, expected: str) -> None:
    rec = record(trigger={"source": source, "name": "x"})
    assert assemble(rec, fixed(rec), excerpt_chars=1, untrusted_inline=inline).trust_class == expected


# -- REQ-8 eligibility --------------------------------------------------------------------------------

@pytest.mark.req8
def test_eligibility_reasons() -> None:
    rec = record()
    assert skip_reason(rec, fixed(rec)) is None
    assert skip_reason(rec, fixed(rec), record_trace=False) == "record_trace_off"
    assert skip_reason(rec, fixed(rec), memory_record=False) == "memory_record_off"
    assert skip_reason(record(spawned_process=False), fixed(rec)) == "no_process"
    assert skip_reason(rec, fixed(rec, key=None)) == "no_repository"
    only_subagents = record(sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": API, "subagent": True}])
    assert skip_reason(only_subagents, fixed(only_subagents)) == "no_repository"
    with pytest.raises(ValueError):
        assemble(rec, fixed(rec, key=None), excerpt_chars=1)


# -- repositories with real git -----------------------------------------------------------------------

@pytest.mark.req5
async def test_sessions_resolve_from_git_and_only_the_primary_repository_counts(tmp_path: Path) -> None:
    api = git_repo(tmp_path / "api", ("origin", "git@Forge.Example:acme/api.git"))
    billing = git_repo(tmp_path / "billing", ("upstream", "https://bot:pw@forge.example:8443/acme/billing.git"))
    (api / "cmd" / "server").mkdir(parents=True)
    (billing / "src").mkdir()
    outside = tmp_path / "scratch"
    outside.mkdir()
    rec = record(sessions=[
        {"session_id": "sub-first", "cwd": str(api), "subagent": True},
        {"session_id": "main", "cwd": str(api / "cmd" / "server"), "git_branch": "fix/flaky"},
        {"session_id": "helper", "cwd": str(api), "subagent": True},
        {"session_id": "other", "cwd": str(billing / "src"), "subagent": True},
        {"session_id": "loose", "cwd": str(outside), "subagent": True},
    ], events=[
        edit("main.go", "main"),                        # relative to the session's cwd
        edit(str(api / "go.mod"), "main"),              # absolute inside
        edit("../../internal/x.go", "main"),            # relative, still inside
        edit("../../../billing/src/y.go", "main"),      # relative, escapes the repository
        edit(str(billing / "src" / "z.go"), "main"),    # absolute, another repository
        edit("internal/helper.go", "helper"),           # subagent in the same repository
        edit("internal/first.go", "sub-first"),
        edit("ledger.go", "other"), verify("lint", "other"),
        edit(str(outside / "tmp.go"), "loose"), verify("lint", "loose"),
        verify("test_failure", "main"), verify("test_failure", "helper"),
    ])
    repos = await resolve_sessions(rec)
    assert repos["main"].key == API and repos["other"].key == "forge.example/acme/billing"
    assert repos["loose"].key is None
    ep = assemble(rec, repos, excerpt_chars=10)
    assert (ep.repo, ep.branch, ep.scope) == (API, "fix/flaky", f"project:{API}")
    assert ep.files_touched == ("cmd/server/main.go", "go.mod", "internal/first.go", "internal/helper.go",
                                "internal/x.go")
    assert [(v.error_class, v.count) for v in ep.verify_failures] == [("test_failure", 2)]


async def test_a_repository_without_a_remote_is_keyed_by_its_toplevel(tmp_path: Path) -> None:
    top = git_repo(tmp_path / "solo")
    (top / "a" / "b").mkdir(parents=True)
    rec = record(sessions=[{"session_id": "s1", "cwd": str(top / "a" / "b")}], events=[edit("c.py")])
    repos = await resolve_sessions(rec)
    ep = assemble(rec, repos, excerpt_chars=1)
    assert ep.repo == f"local{top}" and ep.files_touched == ("a/b/c.py",)


async def test_an_explicit_repo_keeps_its_key_but_uses_the_git_toplevel_for_paths(tmp_path: Path) -> None:
    top = git_repo(tmp_path / "checkout", ("origin", "https://forge.example/acme/other.git"))
    (top / "pkg").mkdir()
    rec = record(sessions=[{"session_id": "s1", "cwd": str(top / "pkg"), "repo": "git@forge.example:acme/api.git"}],
                 events=[edit("util.go"), edit(str(top / "README.md")), edit(str(tmp_path / "elsewhere.go"))])
    repos = await resolve_sessions(rec)
    ep = assemble(rec, repos, excerpt_chars=1)
    assert ep.repo == API  # explicit repo, normalised
    assert ep.files_touched == ("README.md", "pkg/util.go")


async def test_a_symlinked_cwd_maps_paths_spelled_either_way(tmp_path: Path) -> None:
    top = git_repo(tmp_path / "real", ("origin", "git@forge.example:acme/api.git"))
    (top / "src").mkdir()
    link = tmp_path / "link"
    link.symlink_to(top)
    rec = record(sessions=[{"session_id": "s1", "cwd": str(link / "src")}],
                 events=[edit(str(link / "src" / "a.go")), edit(str(top / "b.go")), edit("c.go")])
    ep = assemble(rec, await resolve_sessions(rec), excerpt_chars=1)
    assert ep.files_touched == ("b.go", "src/a.go", "src/c.go")


@pytest.mark.req8
async def test_req8_a_cwd_outside_any_repository_has_no_repository(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    rec = record(sessions=[{"session_id": "s1", "cwd": str(work)}], events=[edit("x.go")])
    repos = await resolve_sessions(rec)
    assert repos["s1"].key is None
    assert skip_reason(rec, repos) == "no_repository"
    assert repo_files(rec, repos) == ()


async def test_missing_git_fails_unless_the_session_names_its_repo(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    rec = record(sessions=[{"session_id": "s1", "cwd": str(tmp_path)}])
    with pytest.raises(GitUnavailable):
        await resolve_sessions(rec)
    named = record(sessions=[{"session_id": "s1", "cwd": str(tmp_path), "repo": API}])
    assert (await resolve_sessions(named))["s1"].key == API


def test_paths_for_a_session_without_a_checkout_are_taken_from_its_cwd() -> None:
    where = SessionRepo(key=API, cwd="/srv/api")
    assert repo_relative("a/../b.go", where) == "b.go"
    assert repo_relative("/srv/api/x/y.go", where) == "x/y.go"
    assert repo_relative("/srv/apix/y.go", where) is None
    assert repo_relative("../y.go", where) is None
    relative_cwd = SessionRepo(key=API, cwd="api")
    assert repo_relative("x.go", relative_cwd) == "x.go"
    assert repo_relative("/abs/x.go", relative_cwd) is None
    assert repo_relative("../x.go", relative_cwd) is None
