"""Poison input: run records and RPC parameters are validated at the boundary.

Every bad value is INVALID_ARGUMENT naming the field as a JSON path, never INTERNAL, never a dropped
connection, and the message never repeats the value. The RPC cases run against the real daemon
(run_daemon in-process, its real operator websocket on 127.0.0.1 port 0).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fix_daemon import daemon_in_process
from memactors._wire import parse_run_record
from memactors.daemon import Listening
from memactors.errors import InvalidArgument
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.rpc.server import MAX_DEPTH
from memactors.rpc.tokens import read_token
from support import run_record

SERVICE = "harness.v1.MemoryService"
SECRETISH = "ZZ-rejected-value-must-not-echo"


def rejected(data: dict[str, Any]) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        parse_run_record(data)
    assert SECRETISH not in str(info.value)
    return info.value


def with_session(**fields: Any) -> dict[str, Any]:
    session = {"session_id": "s1", "cwd": "/srv/api", "repo": "forge.example/acme/api", "git_branch": "main"}
    session.update(fields)
    return run_record(sessions=[session])


# (what, record, field named in the error)
BAD_RECORDS: list[tuple[str, dict[str, Any], str]] = [
    ("cost Infinity", run_record(cost_usd=math.inf), "cost_usd"),
    ("cost NaN", run_record(cost_usd=math.nan), "cost_usd"),
    ("cost negative", run_record(cost_usd=-1), "cost_usd"),
    ("duration 1e30", run_record(duration_ms=1e30), "duration_ms"),
    ("duration over 31 days", run_record(duration_ms=31 * 86_400_000 + 1), "duration_ms"),
    ("newline in harness", run_record(harness=f"api\n{SECRETISH}"), "harness"),
    ("newline in adapter", run_record(adapter=f"cc\r{SECRETISH}"), "adapter"),
    ("newline in run_id", run_record(run_id=f"1\n{SECRETISH}"), "run_id"),
    ("control char in session id", with_session(session_id=f"s\x1b{SECRETISH}"), "sessions[0].session_id"),
    ("newline in repo", with_session(repo=f"forge.example/acme/api\n{SECRETISH}"), "sessions[0].repo"),
    ("newline in branch", with_session(git_branch=f"main\n{SECRETISH}"), "sessions[0].git_branch"),
    ("newline in cwd", with_session(cwd=f"/srv/api\n{SECRETISH}"), "sessions[0].cwd"),
    ("newline in path", run_record(events=[{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z",
                                            "path": f"src/a.go\n{SECRETISH}"}]), "events[0].path"),
    ("repo escaping upwards", with_session(repo=f"../../etc/{SECRETISH}"), "sessions[0].repo"),
    ("repo with a .. segment", with_session(repo=f"forge.example/../{SECRETISH}"), "sessions[0].repo"),
    ("repo of one segment", with_session(repo=SECRETISH), "sessions[0].repo"),
    ("repo of 10 KB", with_session(repo="forge.example/acme/" + SECRETISH + "x" * 10_000), "sessions[0].repo"),
    ("repo of 300 bytes", with_session(repo="forge.example/acme/" + "é" * 130), "sessions[0].repo"),
    ("date-only started_at", run_record(started_at="2026-11-28"), "started_at"),
    ("date-only ended_at", run_record(ended_at="2026-11-28"), "ended_at"),
    ("time without offset", run_record(started_at="2026-11-28T09:00:00"), "started_at"),
    ("impossible date", run_record(started_at="2026-13-40T09:00:00Z"), "started_at"),
    ("harness of 300 characters", run_record(harness="h" * 300), "harness"),
    ("harness wrong type", run_record(harness=42), "harness"),
    ("sessions wrong type", run_record(sessions={"s": 1}), "sessions"),
    ("unknown trigger source", run_record(trigger={"source": SECRETISH}), "trigger.source"),
]


@pytest.mark.parametrize(("what", "record", "field"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_a_poison_run_record_is_rejected_naming_the_field_never_the_value(
        what: str, record: dict[str, Any], field: str) -> None:
    error = rejected(record)
    assert error.code == "INVALID_ARGUMENT"
    assert error.context["field"] == field, str(error)
    assert f"invalid field {field}:" in str(error)


def test_a_record_without_spawned_process_is_rejected_not_defaulted_to_true() -> None:
    record = run_record()
    del record["spawned_process"]
    assert rejected(record).context["field"] == "spawned_process"


def test_operator_is_a_trigger_source() -> None:
    assert parse_run_record(run_record(trigger={"source": "operator"})).trigger.source == "operator"


def test_bounded_valid_records_still_parse() -> None:
    record = run_record(cost_usd=0.0, duration_ms=31 * 86_400_000, harness="h" * 256,
                        sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": "git@forge.example:acme/api.git"}])
    parsed = parse_run_record(record)
    assert parsed.cost_usd == 0.0 and parsed.sessions[0].repo == "git@forge.example:acme/api.git"
    assert parse_run_record(with_session(repo="local/home/u/src/api")).sessions[0].repo == "local/home/u/src/api"


# ------------------------------------------------------------------------------------------ the daemon


async def raw_call(ws: trio_websocket.WebSocketConnection, frame: str) -> dict[str, Any]:
    await ws.send_message(frame)
    with trio.fail_after(30):
        return json.loads(await ws.get_message())


@asynccontextmanager
async def raw_socket(listening: Listening, state: Path) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    token = read_token(state, "control")
    async with trio_websocket.open_websocket_url(
            listening.operator, extra_headers=[("Authorization", f"Bearer {token}")]) as ws:
        yield ws


# (method, params, field named in the error)
BAD_PARAMS: list[tuple[str, dict[str, Any], str]] = [
    ("GetEpisode", {"episode_id": 5}, "params.episode_id"),
    ("GetEpisode", {"episode_id": ["x"]}, "params.episode_id"),
    ("Forget", {"episode_id": {"a": 1}}, "params.episode_id"),
    ("ListEpisodes", {"limit": "10"}, "params.limit"),
    ("ListEpisodes", {"limit": -1}, "params.limit"),
    ("ListEpisodes", {"limit": True}, "params.limit"),
    ("ListEpisodes", {"harness": 3}, "params.harness"),
    ("ListEpisodes", {"since": f"not a time {SECRETISH}"}, "since"),
    ("Recall", {"query": 1, "repo": "forge.example/acme/api"}, "params.query"),
    ("Recall", {"query": "x", "repo": "forge.example/acme/api", "paths": "src"}, "params.paths"),
    ("Recall", {"query": "x", "repo": "forge.example/acme/api", "paths": [1]}, "params.paths[0]"),
    ("Recall", {"query": "x", "repo": "forge.example/acme/api", "paths": ["a" * 50_000]}, "params.paths[0]"),
    ("Recall", {"query": "x", "repo": "forge.example/acme/api", "limit": 1.5}, "params.limit"),
    ("Recall", {"query": "x", "as": f"no-such-harness-{SECRETISH}"}, "params.as"),
    ("IngestRun", {"record": "a string"}, "params.record"),
    ("IngestRun", {"record": run_record(cost_usd=math.inf)}, "cost_usd"),
    ("AddFact", {"scope": "fleet", "text": "t", "confidence": "high"}, "params.confidence"),
    ("AddFact", {"scope": ["fleet"], "text": "t", "confidence": 0.5}, "params.scope"),
    ("LinkPullRequest", {"repo": "forge.example/acme/api", "branch": 1, "url": "u"}, "params.branch"),
    ("ReportPresence", {"harness": "h", "run_id": "1", "session_id": "s", "repo": "r",
                        "ttl_seconds": "300"}, "params.ttl_seconds"),
    ("ReportPresence", {"harness": f"h\n{SECRETISH}", "run_id": "1", "session_id": "s", "repo": "r"},
     "params.harness"),
    ("CastVote", {"fact_id": None, "run_id": "1", "harness": "h", "stance": "up"}, "params.fact_id"),
    ("MintRunToken", {"harness": "h", "run_id": 7}, "params.run_id"),
    ("MintRunToken", {"harness": "h", "run_id": "1", "replace": "yes"}, "params.replace"),
    ("RevokeRunTokens", {"harness": "h"}, "params.run_id"),
    ("GetBriefing", {"harness": {"x": 1}}, "params.harness"),
    ("CheckProvider", {"provider": 1}, "params.provider"),
]


def _encode(params: dict[str, Any]) -> str:
    return json.dumps(params)  # Infinity/NaN go out as the JSON extensions Python's parser accepts


@pytest.mark.slow
async def test_wrong_typed_and_oversized_rpc_params_are_invalid_argument_naming_the_field(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening), raw_socket(listening, tmp_path / "state") as ws:
        for i, (method, params, field) in enumerate(BAD_PARAMS):
            frame = f'{{"id": {i}, "method": "{SERVICE}/{method}", "params": {_encode(params)}}}'
            reply = await raw_call(ws, frame)
            assert reply["id"] == i
            error = reply.get("error")
            assert error and error["code"] == "INVALID_ARGUMENT", (method, params, reply)
            assert field in error["message"], (method, error)
            assert SECRETISH not in error["message"] and "a" * 100 not in error["message"]
        # The connection survived all of them.
        assert (await raw_call(ws, f'{{"id": 999, "method": "{SERVICE}/Status"}}'))["id"] == 999


@pytest.mark.slow
async def test_deeply_nested_json_gets_an_invalid_argument_reply_not_a_dropped_connection(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening), raw_socket(listening, tmp_path / "state") as ws:
        for depth in (MAX_DEPTH + 1, 5_000, 200_000):
            nested = "[" * depth + "]" * depth
            reply = await raw_call(ws, f'{{"id": 1, "method": "{SERVICE}/Status", "params": {{"x": {nested}}}}}')
            assert reply["error"]["code"] == "INVALID_ARGUMENT", depth
            assert "nests deeper" in reply["error"]["message"]
        assert "result" in await raw_call(ws, f'{{"id": 2, "method": "{SERVICE}/Status"}}')


@pytest.mark.slow
async def test_the_rpc_client_refuses_unsendable_params_without_a_traceback(tmp_path: Path) -> None:
    async with daemon_in_process(tmp_path) as (_, listening):
        async with connect_rpc(listening.operator, read_token(tmp_path / "state", "control")) as rpc:
            deep: Any = []
            for _ in range(100_000):
                deep = [deep]
            for params in ({"record": {"cost_usd": math.inf}}, {"record": deep}):
                with pytest.raises(RpcError) as info:
                    await rpc.call(f"{SERVICE}/IngestRun", params)
                assert info.value.code == "INVALID_ARGUMENT"
            assert "state" in await rpc.call(f"{SERVICE}/Status")


# ------------------------------------------------------------------------------------ property tests

_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
_json = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
_FIELDS = ["harness", "adapter", "run_id", "trace_id", "started_at", "ended_at", "duration_ms", "cost_usd",
           "cost_source", "model", "outcome", "reason", "result_text", "trigger", "spawned_process", "sessions",
           "events", "prompt"]


@st.composite
def mutated_records(draw: st.DrawFn) -> dict[str, Any]:
    record = copy.deepcopy(run_record(events=[{"kind": "edit", "session_id": "s1", "at": "2026-11-28T09:01:00Z",
                                               "path": "src/a.go"}]))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "session", "event"]))
        value = draw(_json)
        if where == "top":
            record[draw(st.sampled_from(_FIELDS))] = value
        elif where == "session" and isinstance(record.get("sessions"), list) and record["sessions"]:
            target = record["sessions"][0]
            if isinstance(target, dict):
                target[draw(st.sampled_from(["session_id", "cwd", "repo", "git_branch", "subagent", "started_at"]))] = value
        elif isinstance(record.get("events"), list) and record["events"]:
            target = record["events"][0]
            if isinstance(target, dict):
                target[draw(st.sampled_from(["kind", "session_id", "at", "path", "ok", "error_class"]))] = value
    return record


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_records())
def test_property_any_record_parses_or_is_invalid_argument(record: dict[str, Any]) -> None:
    try:
        parse_run_record(record)
    except InvalidArgument as exc:
        assert exc.context.get("field")


_METHODS = ["Status", "ListEpisodes", "GetEpisode", "Recall", "IngestRun", "Forget", "GetBriefing", "AddFact",
            "LinkPullRequest", "ReportPresence", "CastVote", "MintRunToken", "RevokeRunTokens"]
_PARAM_NAMES = ["episode_id", "harness", "repo", "since", "limit", "query", "as", "paths", "record", "source",
                "scope", "text", "confidence", "status", "id", "branch", "url", "run_id", "session_id",
                "ttl_seconds", "fact_id", "stance", "workdir"]


@pytest.mark.slow
async def test_property_rpc_frames_never_yield_internal_or_a_dropped_connection(tmp_path: Path) -> None:
    """Random frames (hypothesis) against the real daemon's websocket: every one gets a reply, none INTERNAL."""
    frames: list[str] = []
    records = mutated_records()
    params = st.dictionaries(st.sampled_from(_PARAM_NAMES), _json | records, max_size=5)
    frame = st.one_of(
        st.builds(lambda m, p: json.dumps({"id": 1, "method": f"{SERVICE}/{m}", "params": p}),
                  st.sampled_from(_METHODS), params),
        st.builds(lambda p: json.dumps({"id": 1, "method": f"{SERVICE}/IngestRun", "params": {"record": p}}), records),
        st.builds(json.dumps, _json),
        st.text(max_size=60),
    )

    @settings(max_examples=250, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(frame)
    def collect(f: str) -> None:
        frames.append(f)

    collect()
    async with daemon_in_process(tmp_path) as (_, listening), raw_socket(listening, tmp_path / "state") as ws:
        for f in frames:
            reply = await raw_call(ws, f)  # a dropped connection raises here
            error = reply.get("error")
            assert not error or error["code"] != "INTERNAL", (f[:300], reply)
        assert "result" in await raw_call(ws, f'{{"id": 2, "method": "{SERVICE}/Status"}}')


@pytest.mark.slow
async def test_the_cli_reports_poison_files_and_goes_on_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memactors import cli

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    infinite = tmp_path / "infinite.json"
    infinite.write_text(json.dumps(run_record(cost_usd=1.0)).replace("1.0", "Infinity"))
    nested = tmp_path / "nested.json"
    inner: Any = {}
    for _ in range(200):
        inner = {"x": inner}
    nested.write_text(json.dumps(run_record(model=inner)))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(run_record()))
    async with daemon_in_process(tmp_path) as _:
        argv = ["--config", str(tmp_path / "harness.toml"), "runs", "ingest",
                str(deep), str(infinite), str(nested), str(good)]
        code = await trio.to_thread.run_sync(cli.main, argv)
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in out + err
    assert f"rejected {deep}:" in err and f"rejected {infinite}:" in err and f"rejected {nested}:" in err
    assert "Infinity or NaN" in err  # the client refuses Infinity before it reaches the wire
    assert "4 record(s): 1 " in out and "3 rejected" in out  # the good one went in all the same
