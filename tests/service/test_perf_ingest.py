"""Ingest at the speed of SQLite: the fast paths of the write path give the answers of the
reference paths they stand in front of, and a batch is one write transaction with per-record results.

No timings here (speed belongs in bench/): these tests pin the behaviour the fast paths must keep.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from memactors._wire import _fast_valid, _run_record_validator, parse_run_record
from memactors.errors import InvalidArgument
from memactors.service import MemoryService
from support import acknowledged, run_record, wait_ready

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _examples() -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(EXAMPLES.glob("run-*.json"))]


def _instances() -> list[Any]:
    """Valid records and records broken in every way the schema checks (type, enum, pattern, bounds,
    required, extra nesting), plus values that are not plain JSON."""
    out: list[Any] = [*_examples(), run_record()]
    base = run_record()
    for key, value in [
        ("harness", 7), ("harness", ""), ("harness", "x" * 10_000), ("harness", "bad\nname"),
        ("harness", "trailing\n"), ("outcome", "maybe"), ("reason", None), ("duration_ms", -1),
        ("duration_ms", "600"), ("started_at", "yesterday"), ("started_at", "2026-11-28T09:00:00Z\n"),
        ("ended_at", "2026-13-28 09:00:00"), ("spawned_process", "yes"), ("sessions", []),
        ("sessions", [{"cwd": "/srv/api"}]), ("sessions", [{"session_id": "s1", "cwd": 3}]),
        ("events", [{"kind": "edit"}]), ("events", [{"kind": "nope", "session_id": "s1", "at": "x"}]),
        ("events", "none"), ("result_text", ["a"]), ("model", {"served": 1}), ("trigger", {"source": 5}),
        ("cost_usd", "1"), ("prompt", {"x": 1}),
    ]:
        broken = copy.deepcopy(base)
        broken[key] = value
        out.append(broken)
    missing = copy.deepcopy(base)
    del missing["run_id"]
    out.append(missing)
    as_tuple = copy.deepcopy(base)
    as_tuple["sessions"] = tuple(as_tuple["sessions"])  # jsonschema: not an array
    out.append(as_tuple)
    out.append({**copy.deepcopy(base), 3: "non-string key"})
    return out


def test_the_compiled_run_record_check_passes_only_what_jsonschema_passes() -> None:
    reference = _run_record_validator()
    seen_valid = seen_invalid = 0
    for instance in _instances():
        valid = not any(True for _ in reference.iter_errors(instance)) if isinstance(instance, dict) else False
        if _fast_valid(instance):
            assert valid, instance  # never a record jsonschema refuses
        seen_valid += valid
        seen_invalid += not valid
    assert seen_valid >= 5 and seen_invalid >= 20
    # Valid plain records take the fast path (the point of it). A value ending in a line break is the
    # one place the two differ: jsonschema's `$` (Python's re) matches before it, the compiled one does
    # not, so such a record is left to jsonschema, which accepts it as before.
    for valid in [*_examples(), run_record()]:
        assert _fast_valid(valid)
    trailing = run_record(harness="trailing\n")
    assert not _fast_valid(trailing) and parse_run_record(trailing).harness == "trailing\n"


@pytest.mark.parametrize("key, value, field", [
    ("outcome", "maybe", "outcome"), ("duration_ms", -1, "duration_ms"),
    ("started_at", "yesterday", "started_at"), ("harness", "bad\nname", "harness"),
])
def test_a_refused_record_still_names_its_field(key: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_run_record(run_record(**{key: value}), source="r.json")
    assert info.value.context.get("field") == field and "r.json" in str(info.value)


def _candidates_by_scan(redactor: Any, text: str) -> list[str]:
    """The reference: each keyword tested with `in` on the lower-cased text (the old loop)."""
    lowered = text.lower()
    chosen = set(redactor._always)
    for k in redactor._keywords:
        if k in lowered:
            chosen.update(redactor._by_keyword[k])
    return [redactor.rules[i].id for i in sorted(chosen)]


def test_the_keyword_automaton_picks_the_rules_the_keyword_scan_picks() -> None:
    import random

    from memactors.redact import shared

    redactor = shared()
    keywords = list(redactor._keywords)
    rng = random.Random(11)
    texts = ["", "plain words about the ledger", "SK-LIVE and AKIA and ghp_ in caps", "Straße İstanbul ﬁle"]
    for _ in range(300):  # random prose with keywords (overlapping, nested, upper-cased) spliced in
        parts = []
        for _ in range(rng.randint(1, 12)):
            word = rng.choice(keywords) if rng.random() < 0.4 else "".join(
                rng.choice("abcdefghijklmnopqrstuvwxyz_-.:/~0123456789") for _ in range(rng.randint(1, 9)))
            parts.append(word.upper() if rng.random() < 0.2 else word)
        texts.append(rng.choice(["", " ", "-"]).join(parts))
    picked_some = 0
    for text in texts:
        expected = _candidates_by_scan(redactor, text)
        assert [r.id for r in redactor.candidates(text)] == expected, text
        picked_some += len(expected) > len(redactor._always)
    assert picked_some > 100  # the texts did exercise keyword rules


# -- the batch: one write transaction, a result per record --------------------------------------------

async def test_a_batch_is_written_in_one_transaction_and_a_failing_record_rolls_back_alone(
        memory: MemoryService, monkeypatch: pytest.MonkeyPatch) -> None:
    """IngestRuns writes every run, episode and pending record of the batch in one `record_runs` call
    (one transaction); a record refused at parse time and one whose write fails get their own results
    and leave nothing behind, the others are committed, listed and recallable."""
    from memactors.actors import index
    from memactors.store import episodes

    calls: list[int] = []
    real_runs, real_episode = index.record_runs, episodes.store_episode

    def counting(db: Any, runs: Any, now: str, claimer: str = "") -> Any:
        calls.append(len(runs))
        return real_runs(db, runs, now, claimer)

    def failing(db: Any, episode: Any, **kw: Any) -> bool:
        if episode.run_id == "w":
            raise InvalidArgument("the store refused this episode", field="episode")
        return real_episode(db, episode, **kw)

    monkeypatch.setattr(index, "record_runs", counting)
    monkeypatch.setattr(episodes, "store_episode", failing)
    out = await memory.ingest_runs([
        {"record": run_record(run_id="a", result_text="ledger rounding fixed"), "source": "a.json"},
        {"record": run_record(run_id="b", started_at="yesterday"), "source": "b.json"},
        {"record": run_record(run_id="w", result_text="ledger write refused"), "source": "w.json"},
        {"record": run_record(run_id="c", result_text="ledger rounding again"), "source": "c.json"},
        {"record": run_record(run_id="a"), "source": "a-again.json"},
    ])
    results = out["results"]
    assert [r["outcome"] for r in results][1:3] == ["rejected", "rejected"]
    assert {results[0]["outcome"], results[3]["outcome"]} <= {"recorded", "queued"}
    assert results[4]["outcome"] == "duplicate" and results[4]["episode_id"] == results[0]["episode_id"]
    assert "started_at" in results[1]["error"]["message"] and results[1]["source"] == "b.json"
    assert results[2]["source"] == "w.json" and "refused" in results[2]["error"]["message"]
    assert calls == [3]  # a, w and c: one write for the batch (b was refused before it)
    runs = await memory.store.read(lambda db: sorted(r for (r,) in db.execute("SELECT run_id FROM runs")))
    assert runs == ["a", "c"]  # w's run row rolled back with its episode
    listed = await memory.list_episodes()
    assert sorted(e["run_id"] for e in listed["episodes"]) == ["a", "c"]


async def test_the_retry_loop_leaves_a_fresh_record_to_the_ingest_attempt(memory: MemoryService) -> None:
    """The pending record row of an ingested episode is claimed by this daemon until the ingest's own
    attempt is over (`record_after`): the loop — this daemon's, or another's sharing the store — does not
    race it (which made one of the two answer "queued")."""
    from memactors.actors.assembler import AssembleMany
    from memactors.actors.index import RecordRun, RecordRuns
    from memactors.service.ingest import prepare_record

    record = prepare_record(run_record(run_id="p", result_text="ledger"), "p.json")
    (assembled,) = await memory.assembler.address.ask(AssembleMany(((record, None),)))
    later = "2999-01-01T00:00:00.000000Z"
    (stored,) = await memory.index.address.ask(RecordRuns((RecordRun(
        record=record, repo=assembled.repo, branch=assembled.branch, paths=assembled.paths,
        episode=assembled.episode, text=assembled.text, provider=memory.provider, clean=True,
        record_after=later),)))
    # (one write for the batch is the test above's: the store's transaction counter also counts the
    # service's own loops' writes, e.g. the call log's batches, so it is no measure here)
    assert stored.run_new and stored.episode_new
    row = await memory.store.read(lambda db: db.execute(
        "SELECT claimed_until, claimed_by FROM pending WHERE kind = 'record' AND episode_id = ?",
        [assembled.episode.episode_id]).fetchone())
    assert tuple(row) == (later, memory.store.daemon_id)


# -- storage ----------------------------------------------------------------------------------------

def test_the_stored_run_record_is_compact_and_loads_back_the_same() -> None:
    from memactors._wire import converter, load_run_record
    from memactors.episode import stored_record
    from memactors.store.run_history import record_json

    for data in [*_examples(), run_record()]:
        record = stored_record(parse_run_record(data))
        raw = converter.unstructure(record)
        raw.pop("prompt", None)
        text = record_json(raw)
        assert "null" not in text and ": " not in text.replace('": "', "")
        again = load_run_record(text)
        assert again == attrs.evolve(record, prompt=None)


async def test_a_new_store_has_8k_pages_and_an_old_4k_store_keeps_working(
        tmp_path: Path, make_holder: Any) -> None:
    import sqlean

    from memactors.service import open_memory_service
    from memactors.store.engines import open_store
    from memactors.store.sqlite import PAGE_SIZE

    fresh = await open_store(tmp_path / "new" / "memactors.db")
    try:
        assert fresh._writer.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 8192
    finally:
        fresh.close()
    # A store created with 4 KiB pages (before this change) keeps them and ingests as before.
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    old = sqlean.connect(str(state / "memactors.db"), isolation_level=None)
    old.execute("PRAGMA journal_mode = WAL")
    old.execute("CREATE TABLE before_8k (x)")
    old.close()
    async with open_memory_service(make_holder("")) as svc:
        await wait_ready(svc)
        assert await svc.store.read(lambda db: db.execute("PRAGMA page_size").fetchone()[0]) == 4096
        result = await svc.ingest_run(run_record(run_id="old", result_text="ledger on an old store"))
        assert result["outcome"] in {"recorded", "queued"}
        found = await svc.recall(query="ledger", repo="forge.example/acme/api", limit=5)
        assert [e["episode_id"] for e in found["episodes"]] == [result["episode_id"]]


async def test_sessions_resolved_for_a_batch_are_those_resolved_one_by_one(tmp_path: Path) -> None:
    """`resolve_sessions_many` (git for all distinct cwds in one hop) answers what `resolve_sessions`
    answers for each record: a checkout with a remote, one reached through a symlink, a subdirectory, a
    missing directory, an explicit repository key, a session id used twice."""
    import os
    import subprocess

    from memactors.episode import resolve_sessions, resolve_sessions_many
    from memactors.repo import clear_cache

    top = tmp_path / "api"

    def checkout() -> None:
        (top / "pkg").mkdir(parents=True)
        subprocess.run(["git", "-C", str(top), "init", "-q"], check=True)
        subprocess.run(["git", "-C", str(top), "remote", "add", "origin", "git@forge.example:acme/api.git"],
                       check=True)
        os.symlink(top, tmp_path / "link")

    await trio.to_thread.run_sync(checkout)
    sessions = [
        [{"session_id": "s1", "cwd": str(top / "pkg"), "git_branch": "main"}],
        [{"session_id": "s1", "cwd": str(tmp_path / "link" / "pkg")},
         {"session_id": "s2", "cwd": str(top), "subagent": True}],
        [{"session_id": "s1", "cwd": str(tmp_path / "missing"), "repo": "forge.example/acme/other"}],
        [{"session_id": "s1", "cwd": str(tmp_path / "missing")},
         {"session_id": "s1", "cwd": str(top)}],
    ]
    records = [parse_run_record(run_record(run_id=str(n), sessions=s)) for n, s in enumerate(sessions)]
    clear_cache()
    together = await resolve_sessions_many(records)
    clear_cache()
    one_by_one = [await resolve_sessions(r) for r in records]
    assert together == one_by_one
    assert together[0]["s1"].key == "forge.example/acme/api" and together[3]["s1"].key is None
    assert len(together[1]["s1"].roots) == 2  # the toplevel and its spelling through the symlink


async def test_a_record_attempt_past_provider_timeout_hands_its_row_back_to_the_retry_loop(
        make_holder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingest holds its pending row back from the retry loop only while its own attempt runs: an
    attempt that outlives provider_timeout answers "queued" and leaves the row due at once (the old
    behaviour), not after `record_after`; the episode is then recorded once the slow provider answers."""
    from memactors.builtin import BuiltinProvider
    from memactors.service import open_memory_service
    from memactors.store import iso

    release = trio.Event()
    real = BuiltinProvider.record

    async def slow(self: BuiltinProvider, args: dict[str, Any]) -> dict[str, Any]:
        await release.wait()  # answers only once the ingest has given up on it
        return await real(self, args)

    monkeypatch.setattr(BuiltinProvider, "record", slow)
    async with open_memory_service(make_holder('[memory.episodes]\nprovider_timeout = "200ms"\n')) as svc:
        await wait_ready(svc)
        result = await svc.ingest_run(run_record(run_id="slow", result_text="ledger slow provider"))
        assert result["outcome"] == "queued"
        now = iso(svc.wall_clock())
        row = await svc.store.read(lambda db: db.execute(
            "SELECT next_at FROM pending WHERE kind = 'record' AND episode_id = ?", [result["episode_id"]]).fetchone())
        assert row is not None and row[0] <= now  # due now: the loop may take it over
        release.set()

        async def indexed() -> bool:
            return await svc.store.read(lambda db: db.execute(
                "SELECT count(*) FROM memory_index WHERE episode_id = ?", [result["episode_id"]]).fetchone()[0]) == 1

        with trio.fail_after(60):
            while not await indexed():  # noqa: ASYNC110 -- waits on the store's state
                await trio.sleep(0.02)


# -- the daemon: what a batch logs and counts -----------------------------------------------------------

def _sample(metrics_text: str, family: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics_text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(family + "{") and ",".join(sorted(name[len(family) + 1:-1].split(","))) == want:
            return float(value)
    return 0.0


async def test_a_batch_logs_one_info_line_and_still_counts_every_episode(tmp_path: Path) -> None:
    """IngestRuns into the daemon (no utility model configured): one INFO `runs ingested` line for the
    batch, no INFO line per record (`episode recorded`, the unconfigured `episode summary` fallback), and
    every episode still counted: recorded ok and summary fallback, once each. A single IngestRun keeps
    its INFO `run ingested` line."""
    import httpx2

    from fix_daemon import daemon_process
    from memactors.rpc.client import connect_rpc

    service = "harness.v1.MemoryService"
    with daemon_process(tmp_path) as daemon:
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            out = await rpc.call(f"{service}/IngestRuns", {"records": [
                {"record": run_record(run_id=f"b{n}", result_text=f"ledger rounding {n}"), "source": f"b{n}.json"}
                for n in range(12)]})
            assert acknowledged([r["outcome"] for r in out["results"]]) == ["recorded"] * 12
            one = await rpc.call(f"{service}/IngestRun", {"record": run_record(run_id="s", result_text="ledger")})
            assert acknowledged(one["outcome"]) == "recorded"
            with trio.fail_after(60):  # a queued record (a loaded machine) is retried soon: wait for it
                while (await rpc.call(f"{service}/Status", {}))["pending"]["records"]:  # noqa: ASYNC110 -- polls the daemon's own state
                    await trio.sleep(0.05)
            listed = await rpc.call(f"{service}/ListEpisodes", {"limit": 50})
            assert len(listed["episodes"]) == 13
        async with httpx2.AsyncClient() as http:
            text = (await http.get(daemon.info["metrics"])).text
    assert _sample(text, "harness_memory_episode_summaries_total", outcome="fallback") == 13
    assert _sample(text, "harness_memory_episodes_recorded_total", provider="builtin", outcome="ok") == 13
    info = [line for line in daemon.log_text().splitlines() if " INFO " in line]
    assert sum(" runs ingested " in line for line in info) == 1
    assert sum(" run ingested " in line for line in info) == 1  # the single IngestRun's
    assert not [line for line in info if " episode recorded " in line or " episode summary " in line]


# -- redaction of many strings at once -------------------------------------------------------------------

_TRICKY = ["password=hunter2hunter2", "AKIAIOSFODNN7EXAMPLE", "ghp_" + "a" * 36, "token: abcdef0123456789abcdef",
           "pass\x01word: xyzxyzxyz123", "İstanbul ΣΑΣ api_key=Zx9sk2l3kjhgfdsa", "\x00", "sk-" + "b" * 48,
           "-----BEGIN RSA PRIVATE KEY-----", "\x85", "to", "ken=", ""]


def test_redacting_many_strings_at_once_gives_each_strings_own_redaction() -> None:
    """`redact_many` (one keyword pass over all the strings) answers exactly what `redact` answers for
    each string alone: secrets, keywords split across neighbouring strings (no match may leak from one
    string into the next), control characters that join a keyword once stripped, case folding that
    changes a string's length, empty strings."""
    import random

    from memactors.redact import shared

    redactor = shared()
    rng = random.Random(11)
    words = ["ledger", "rounding", "retry", "api", "key", "tok", "en", "secret", "the", "Σ", "İ"]
    for _ in range(400):
        texts = []
        for _ in range(rng.randint(0, 12)):
            parts = [rng.choice(words) for _ in range(rng.randint(0, 8))]
            for _ in range(rng.randint(0, 2)):
                parts.insert(rng.randint(0, len(parts)), rng.choice(_TRICKY))
            texts.append(rng.choice(["", " ", "\n"]).join(parts))
        assert redactor.redact_many(texts) == [redactor.redact(t) for t in texts], texts


def test_the_rendering_is_the_line_by_line_redaction_of_its_fields() -> None:
    """`render_text` cleans its lines together; the text is byte for byte what cleaning each `name: value`
    line alone gives, secrets in the fields included."""
    from memactors.episode import (
        FIELD_ORDER,
        SessionRepo,
        _line_value,
        assemble,
        clean,
        render_text,
        stored_record,
    )
    from memactors.service.ingest import prepare_record

    for n, tricky in enumerate([*_TRICKY[:10], "lone \ud800 surrogate"]):
        record = stored_record(prepare_record(run_record(
            run_id=f"r{n}", result_text=f"fixed the ledger; {tricky} then retried the rounding"), f"r{n}.json"))
        repos = {s.session_id: SessionRepo(key="forge.example/acme/api", cwd=s.cwd, roots=()) for s in record.sessions}
        episode = assemble(record, repos, excerpt_chars=600)
        expected = "".join(clean(f"{name}: {_line_value(getattr(episode, name))}") + "\n" for name in FIELD_ORDER)
        assert render_text(episode) == expected


@pytest.mark.both_engines
async def test_a_batch_records_its_episodes_to_the_builtin_provider_in_one_call_and_each_is_indexed(
        memory: MemoryService) -> None:
    """IngestRuns hands the built-in provider the batch's new episodes in one in-process call (one
    store transaction), not one MCP call each: the call log holds one `memory_record_episodes` call and
    no `memory_record_episode`; every episode is still recorded, indexed, off the pending queue and
    recallable, and a duplicate in the batch is not recorded again."""
    out = await memory.ingest_runs(
        [{"record": run_record(run_id=f"m{n}", result_text=f"ledger rounding fixed in module{n}"),
          "source": f"m{n}.json"} for n in range(5)]
        + [{"record": run_record(run_id="m0"), "source": "m0-again.json"}])
    outcomes = [r["outcome"] for r in out["results"]]
    assert outcomes == ["recorded"] * 5 + ["duplicate"]
    await memory.call_log.flush()
    tools = await memory.store.read(lambda db: [t for (t,) in db.execute(
        "SELECT tool FROM call_log WHERE tool LIKE 'memory_record%'")])
    assert tools == ["memory_record_episodes"]
    indexed = await memory.store.read(lambda db: sorted(e for (e,) in db.execute(
        "SELECT episode_id FROM memory_index WHERE provider = 'builtin'")))
    assert indexed == sorted(r["episode_id"] for r in out["results"][:5])
    pending = await memory.store.read(lambda db: db.execute(
        "SELECT count(*) FROM pending WHERE kind = 'record'").fetchone()[0])
    assert pending == 0
    found = await memory.recall(query="module3", repo=run_record()["sessions"][0]["repo"], limit=5)
    assert [e["episode_id"] for e in found["episodes"]] == [out["results"][3]["episode_id"]]


async def test_a_batch_record_the_builtin_provider_refuses_falls_back_to_one_record_per_episode(
        memory: MemoryService, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the batch record fails, each episode gets its own memory_record_episode attempt (its own
    retry state), so the batch is recorded all the same and nothing is left pending."""
    from memactors.builtin import BuiltinProvider

    async def refusing(self: BuiltinProvider, args: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("refused")

    monkeypatch.setattr(BuiltinProvider, "record_many", refusing)
    out = await memory.ingest_runs([{"record": run_record(run_id=f"f{n}", result_text=f"ledger {n}"),
                                     "source": f"f{n}.json"} for n in range(3)])
    assert [r["outcome"] for r in out["results"]] == ["recorded"] * 3
    await memory.call_log.flush()
    calls = await memory.store.read(lambda db: [tuple(r) for r in db.execute(
        "SELECT tool, outcome FROM call_log WHERE tool LIKE 'memory_record%' ORDER BY id")])
    assert calls[0][0] == "memory_record_episodes" and calls[0][1] != "ok"
    assert calls[1:] == [("memory_record_episode", "ok")] * 3
    pending = await memory.store.read(lambda db: db.execute(
        "SELECT count(*) FROM pending WHERE kind = 'record'").fetchone()[0])
    assert pending == 0
