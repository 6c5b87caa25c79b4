"""Facts, exposure and votes, the run graph, presence and collisions, run tokens, the briefing cache —
all through the store's writer and readers, on a real SQLite file and on PostgreSQL (`both_engines`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from memactors.errors import InvalidArgument
from memactors.store import (
    Db,
    Store,
    briefing_cache,
    facts,
    iso,
    presence,
    pull_requests,
    run_history,
    run_tokens,
    votes,
)

pytestmark = pytest.mark.both_engines

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
API = "forge.example/acme/api"
WEB = "forge.example/acme/web"
P_API = f"project:{API}"
P_WEB = f"project:{WEB}"


def _add(db: Db, scope: str, text: str, confidence: float, status: str = "live",
         at: datetime = NOW) -> facts.Fact:
    return facts.add_fact(db, scope=scope, text=text, confidence=confidence, status=status, now=at)  # type: ignore[arg-type]


def _run(
    db: Db,
    harness: str,
    run_id: str,
    *,
    repo: str | None = API,
    branch: str | None = "main",
    ended: datetime = NOW,
    paths: Sequence[str] = (),
    outcome: str = "succeeded",
) -> None:
    db.execute(
        "INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
        " repo, branch, ingested_at) VALUES (?, ?, 'claude-code', ?, ?, ?, 'completed', 61000,"
        " ?, ?, ?)",
        [harness, run_id, iso(ended - timedelta(minutes=1)), iso(ended), outcome, repo, branch, iso(ended)],
    )
    for p in paths:
        db.execute(
            "INSERT INTO run_paths (harness, run_id, repo, path) VALUES (?, ?, ?, ?)",
            [harness, run_id, repo, p],
        )


# --------------------------------------------------------------------------------------------- facts


async def test_add_fact_derives_its_id_and_an_update_keeps_created_at(store: Store) -> None:
    first = await store.write(lambda db: _add(db, P_API, "ledger tests flake under load", 0.4))
    again = await store.write(
        lambda db: _add(db, P_API, "ledger tests flake under load", 0.9, at=NOW + timedelta(hours=1))
    )
    assert first.id == facts.fact_id_for(P_API, "ledger tests flake under load")
    assert first.id.startswith("f_") and len(first.id) == 14
    assert again.id == first.id
    assert again.created_at == iso(NOW)
    assert again.updated_at == iso(NOW + timedelta(hours=1))
    stored = await store.read(lambda db: facts.get_fact(db, first.id))
    assert stored == again
    # one searchable copy of the text, not one per write
    assert await store.read(lambda db: facts.search_facts(db, query="ledger", scopes=[P_API], limit=5)) == [again]


async def test_an_explicit_id_rewrites_the_searchable_text(store: Store) -> None:
    def seed(db: Db) -> None:
        facts.add_fact(db, scope=P_API, text="ledger uses postgres", confidence=0.5, now=NOW, fact_id="f_812")
        facts.add_fact(db, scope=P_API, text="billing uses sqlite", confidence=0.5, now=NOW, fact_id="f_812")

    await store.write(seed)
    old = await store.read(lambda db: facts.search_facts(db, query="ledger", scopes=[P_API], limit=5))
    new = await store.read(lambda db: facts.search_facts(db, query="billing", scopes=[P_API], limit=5))
    assert old == []
    assert [f.id for f in new] == ["f_812"]


@pytest.mark.errors
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"confidence": 1.5}, "confidence"),
        ({"confidence": -0.1}, "confidence"),
        ({"confidence": float("nan")}, "confidence"),
        ({"status": "promoted"}, "status"),
        ({"scope": "project:"}, "scope"),
        ({"scope": "team:x"}, "scope"),
        ({"text": "  "}, "text"),
    ],
)
async def test_add_fact_rejects_a_bad_field_by_name(store: Store, kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"scope": P_API, "text": "a fact", "confidence": 0.5, "status": "live"}
    args.update(kwargs)
    with pytest.raises(InvalidArgument) as info:
        await store.write(lambda db: facts.add_fact(db, now=NOW, **args))  # type: ignore[arg-type]
    assert info.value.context["field"] == field
    assert await store.read(lambda db: db.execute("SELECT COUNT(*) FROM facts").fetchone()[0]) == 0


@pytest.mark.req12
async def test_search_facts_stays_in_scope_and_skips_retired_facts(store: Store) -> None:
    def seed(db: Db) -> None:
        _add(db, P_API, "ledger flake is caused by clock skew", 0.7)
        _add(db, P_API, "ledger flake needs a retry", 0.6, status="suspect")
        _add(db, P_API, "ledger flake was the network", 0.9, status="retired")
        _add(db, P_WEB, "ledger flake in the web repo", 0.99)
        _add(db, "fleet", "ledger flake fleet wide", 0.3)

    await store.write(seed)
    found = await store.read(
        lambda db: facts.search_facts(db, query="ledger flake", scopes=[P_API, "fleet"], limit=10)
    )
    texts = {f.text for f in found}
    assert texts == {
        "ledger flake is caused by clock skew",
        "ledger flake needs a retry",
        "ledger flake fleet wide",
    }
    assert {f.status for f in found} == {"live", "suspect"}
    only_api = await store.read(lambda db: facts.search_facts(db, query="ledger", scopes=[P_API], limit=10))
    assert all(f.scope == P_API for f in only_api) and len(only_api) == 2
    top = await store.read(lambda db: facts.top_facts(db, scopes=[P_API], limit=10))
    assert [f.text for f in top] == ["ledger flake is caused by clock skew"]


@pytest.mark.req12
async def test_search_facts_orders_by_bm25_then_confidence_then_id(store: Store) -> None:
    def seed(db: Db) -> tuple[facts.Fact, ...]:
        low = _add(db, P_API, "ledger flake alpha", 0.5)
        high = _add(db, P_API, "ledger flake gamma", 0.9)
        twin_a = _add(db, P_API, "unrelated words here", 0.5)
        twin_b = _add(db, "fleet", "unrelated words here", 0.5)
        far = _add(db, P_API, "ledger " + "padding " * 30, 1.0)
        return low, high, twin_a, twin_b, far

    low, high, twin_a, twin_b, far = await store.write(seed)
    found = await store.read(
        lambda db: facts.search_facts(db, query="ledger flake", scopes=[P_API, "fleet"], limit=10)
    )
    # Equal bm25 for the two short matches: confidence decides; the long one-word match ranks last.
    assert [f.id for f in found] == [high.id, low.id, far.id]
    twins = await store.read(
        lambda db: facts.search_facts(db, query="unrelated", scopes=[P_API, "fleet"], limit=10)
    )
    assert [f.id for f in twins] == sorted([twin_a.id, twin_b.id])
    limited = await store.read(
        lambda db: facts.search_facts(db, query="ledger flake", scopes=[P_API], limit=1)
    )
    assert [f.id for f in limited] == [high.id]


@pytest.mark.req12
@pytest.mark.parametrize("query", ['"', "NEAR(ledger", "ledger AND -flake*", "text:ledger", ")"])
async def test_search_facts_treats_fts_syntax_as_words(store: Store, query: str) -> None:
    await store.write(lambda db: _add(db, P_API, "ledger flake", 0.5))
    found = await store.read(lambda db: facts.search_facts(db, query=query, scopes=[P_API], limit=5))
    assert [f.text for f in found] == ["ledger flake"]


@pytest.mark.req12
async def test_a_wordless_query_returns_top_live_and_suspect_facts_by_confidence(store: Store) -> None:
    def seed(db: Db) -> None:
        _add(db, P_API, "one", 0.2)
        _add(db, P_API, "two", 0.8, status="suspect")
        _add(db, P_API, "three", 0.5)
        _add(db, P_API, "four", 0.99, status="retired")

    await store.write(seed)
    found = await store.read(lambda db: facts.search_facts(db, query=" ?! ", scopes=[P_API], limit=2))
    assert [f.text for f in found] == ["two", "three"]


@pytest.mark.req14
async def test_top_facts_order_by_confidence_then_recency_then_id(store: Store) -> None:
    def seed(db: Db) -> list[facts.Fact]:
        return [
            _add(db, P_API, "older", 0.7, at=NOW),
            _add(db, P_API, "newer", 0.7, at=NOW + timedelta(seconds=1)),
            _add(db, P_API, "tie a", 0.7, at=NOW),
            _add(db, P_API, "tie b", 0.7, at=NOW),
            _add(db, P_API, "best", 0.95, at=NOW - timedelta(days=3)),
            _add(db, P_API, "worst", 0.1, at=NOW + timedelta(days=1)),
        ]

    by_text = {f.text: f for f in await store.write(seed)}
    top = await store.read(lambda db: facts.top_facts(db, scopes=[P_API], limit=5))
    same_instant = sorted([by_text["older"], by_text["tie a"], by_text["tie b"]], key=lambda f: f.id)
    assert [f.id for f in top] == [by_text["best"].id, by_text["newer"].id, *[f.id for f in same_instant]]
    again = await store.read(lambda db: facts.top_facts(db, scopes=[P_API], limit=5))
    assert again == top
    assert await store.read(lambda db: facts.count_facts(db, scopes=[P_API])) == 6


async def test_set_fact_status_retires_and_unknown_ids_fail(store: Store) -> None:
    fact = await store.write(lambda db: _add(db, P_API, "ledger flake", 0.5))
    retired = await store.write(
        lambda db: facts.set_fact_status(db, fact.id, "retired", NOW + timedelta(minutes=5))
    )
    assert retired.status == "retired" and retired.updated_at == iso(NOW + timedelta(minutes=5))
    assert await store.read(lambda db: facts.search_facts(db, query="ledger", scopes=[P_API], limit=5)) == []
    with pytest.raises(facts.UnknownFact):
        await store.write(lambda db: facts.set_fact_status(db, "f_nope", "live", NOW))
    with pytest.raises(InvalidArgument):
        await store.write(lambda db: facts.set_fact_status(db, fact.id, "gone", NOW))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- exposure, votes


@pytest.mark.req17
async def test_req17_a_prepended_briefing_blocks_a_vote(store: Store) -> None:
    def scenario(db: Db) -> tuple[votes.Vote, votes.Vote, votes.Vote]:
        facts.add_fact(db, scope=P_API, text="ledger flake", confidence=0.5, now=NOW, fact_id="f_812")
        facts.add_fact(db, scope=P_API, text="other", confidence=0.5, now=NOW, fact_id="f_900")
        n = votes.record_exposure(
            db, run_id="r1", harness="nightly-triage", fact_ids=["f_812", "f_812"],
            surface="briefing_prompt", call_id=None, now=NOW,
        )
        assert n == 1
        votes.record_exposure(db, run_id="r2", harness="api-fixer", fact_ids=["f_900"], surface="recall",
                              call_id="c1", now=NOW)
        blocked = votes.cast_vote(db, fact_id="f_812", run_id="r1", harness="nightly-triage",
                                  stance="support", now=NOW + timedelta(minutes=1))
        independent = votes.cast_vote(db, fact_id="f_812", run_id="r2", harness="api-fixer",
                                      stance="support", now=NOW + timedelta(minutes=1))
        oppose = votes.cast_vote(db, fact_id="f_812", run_id="r3", harness="api-fixer",
                                 stance="oppose", now=NOW + timedelta(minutes=1))
        return blocked, independent, oppose

    blocked, independent, oppose = await store.write(scenario)
    assert blocked.counted is False
    assert independent.counted is True and oppose.counted is True
    rows = await store.read(
        lambda db: db.execute("SELECT surface, call_id FROM exposures WHERE run_id = 'r1'").fetchall()
    )
    assert rows == [("briefing_prompt", None)]
    stored = await store.read(
        lambda db: db.execute("SELECT run_id, counted FROM votes ORDER BY id").fetchall()
    )
    assert stored == [("r1", 0), ("r2", 1), ("r3", 1)]
    assert await store.read(lambda db: votes.was_exposed(db, "r1", "f_812")) is True
    assert await store.read(lambda db: votes.was_exposed(db, "r2", "f_812")) is False
    tally = await store.read(lambda db: votes.vote_tally(db, "f_812"))
    assert tally == votes.VoteTally(support_counted=1, oppose_counted=1, uncounted=1)


@pytest.mark.req17
async def test_repeated_votes_from_one_run_count_once(store: Store) -> None:
    def scenario(db: Db) -> votes.VoteTally:
        fact = _add(db, P_API, "ledger flake", 0.5)
        for _ in range(3):
            votes.cast_vote(db, fact_id=fact.id, run_id="r1", harness="h", stance="support", now=NOW)
        return votes.vote_tally(db, fact.id)

    assert await store.write(scenario) == votes.VoteTally(1, 0, 0)


@pytest.mark.errors
async def test_votes_and_exposure_reject_bad_input(store: Store) -> None:
    fact = await store.write(lambda db: _add(db, P_API, "ledger flake", 0.5))
    with pytest.raises(facts.UnknownFact):
        await store.write(lambda db: votes.cast_vote(db, fact_id="f_missing", run_id="r", harness="h",
                                                     stance="support", now=NOW))
    with pytest.raises(InvalidArgument) as info:
        await store.write(lambda db: votes.cast_vote(db, fact_id=fact.id, run_id="r", harness="h",
                                                     stance="maybe", now=NOW))  # type: ignore[arg-type]
    assert info.value.context["field"] == "stance"
    with pytest.raises(InvalidArgument) as info:
        await store.write(lambda db: votes.record_exposure(db, run_id="r", harness="h", fact_ids=[fact.id],
                                                           surface="preview", now=NOW))  # type: ignore[arg-type]
    assert info.value.context["field"] == "surface"
    assert await store.read(lambda db: db.execute("SELECT COUNT(*) FROM votes").fetchone()[0]) == 0


# --------------------------------------------------------------------------------------------- graph


@pytest.mark.req12
async def test_runs_editing_newest_first_limited_to_five_and_to_the_repository(store: Store) -> None:
    def seed(db: Db) -> None:
        for i in range(7):
            _run(db, "api-fixer", f"r{i}", ended=NOW + timedelta(minutes=i), paths=["src/ledger/post.py"])
        _run(db, "api-fixer", "tie-b", ended=NOW + timedelta(minutes=6), paths=["src/ledger/post.py"])
        _run(db, "api-fixer", "other-path", ended=NOW + timedelta(hours=1), paths=["README.md"])
        _run(db, "web-fixer", "other-repo", repo=WEB, ended=NOW + timedelta(hours=2),
             paths=["src/ledger/post.py"])

    await store.write(seed)
    runs = await store.read(
        lambda db: run_history.runs_editing(db, repo=API, paths=["src/ledger/post.py", "docs/x.md"])
    )
    assert [r.run_id for r in runs] == ["r6", "tie-b", "r5", "r4", "r3"]
    assert all(r.repo == API for r in runs)
    by_dir = await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=["./src/ledger/"], limit=2))
    assert [r.run_id for r in by_dir] == ["r6", "tie-b"]
    assert await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=["src/led"])) == []
    assert await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=[])) == []


@pytest.mark.req12
async def test_runs_editing_escapes_like_wildcards(store: Store) -> None:
    await store.write(lambda db: _run(db, "h", "r1", paths=["src/aXb/c.py"]))
    assert await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=["src/a_b"])) == []
    assert await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=["src/%"])) == []
    found = await store.read(lambda db: run_history.runs_editing(db, repo=API, paths=["src/aXb"]))
    assert [r.run_id for r in found] == ["r1"]


@pytest.mark.req14
async def test_recent_runs_by_repository_and_branch_carry_the_pull_request(store: Store) -> None:
    def seed(db: Db) -> None:
        _run(db, "api-fixer", "old", branch="fix/ledger", ended=NOW)
        _run(db, "nightly", "new", branch="fix/ledger", ended=NOW + timedelta(hours=1), outcome="failed")
        _run(db, "api-fixer", "main-run", branch="main", ended=NOW + timedelta(hours=2))
        _run(db, "web", "web-run", repo=WEB, branch="fix/ledger", ended=NOW + timedelta(hours=3))
        pull_requests.link_pull_request(db, repo=API, branch="fix/ledger", url="https://forge.example/acme/api/pull/7",
                                now=NOW)
        pull_requests.link_pull_request(db, repo=API, branch="fix/ledger", url="https://forge.example/acme/api/pull/9",
                                now=NOW + timedelta(minutes=5))

    await store.write(seed)
    runs = await store.read(lambda db: run_history.recent_runs(db, repo=API, branch="fix/ledger"))
    assert [(r.harness, r.run_id, r.outcome) for r in runs] == [
        ("nightly", "new", "failed"),
        ("api-fixer", "old", "succeeded"),
    ]
    first = runs[0]
    assert first.adapter == "claude-code"
    assert first.ended_at == iso(NOW + timedelta(hours=1))
    assert first.duration_ms == 61000
    assert all(r.pull_request == "https://forge.example/acme/api/pull/9" for r in runs)
    main = await store.read(lambda db: run_history.recent_runs(db, repo=API, branch="main"))
    assert [r.run_id for r in main] == ["main-run"] and main[0].pull_request is None
    assert await store.read(lambda db: pull_requests.pull_request_for(db, API, "fix/ledger")) == (
        "https://forge.example/acme/api/pull/9"
    )
    # Re-linking an older pull request makes it the latest.
    await store.write(lambda db: pull_requests.link_pull_request(
        db, repo=API, branch="fix/ledger", url="https://forge.example/acme/api/pull/7", now=NOW + timedelta(hours=1)
    ))
    assert await store.read(lambda db: pull_requests.pull_request_for(db, API, "fix/ledger")) == (
        "https://forge.example/acme/api/pull/7"
    )


@pytest.mark.req14
async def test_recent_runs_stops_at_the_limit(store: Store) -> None:
    await store.write(lambda db: [_run(db, "h", f"r{i}", ended=NOW + timedelta(minutes=i)) for i in range(8)])
    runs = await store.read(lambda db: run_history.recent_runs(db, repo=API, branch="main"))
    assert [r.run_id for r in runs] == ["r7", "r6", "r5", "r4", "r3"]


# -------------------------------------------------------------------------------------------- presence


def _present(db: Db, harness: str, run_id: str, session: str, branch: str | None,
             paths: Sequence[str], *, at: datetime = NOW, ttl: int = 300, repo: str = API) -> None:
    presence.report_presence(db, harness=harness, run_id=run_id, session_id=session, repo=repo, branch=branch,
                          paths=paths, now=at, ttl_seconds=ttl)


@pytest.mark.req14
async def test_collisions_on_branch_and_paths_ignore_expired_and_same_run(store: Store) -> None:
    def seed(db: Db) -> None:
        _present(db, "a", "ra", "s1", "fix/ledger", ["src/ledger/post.py"])
        _present(db, "a", "ra", "s2", "fix/ledger", ["src/ledger/post.py"])      # same run: no collision
        _present(db, "b", "rb", "s1", "fix/ledger", ["docs/readme.md"])           # same branch
        _present(db, "c", "rc", "s1", "main", ["src/ledger"])                     # overlapping paths
        _present(db, "d", "rd", "s1", "fix/ledger", ["src/ledger/post.py"],
                 at=NOW - timedelta(minutes=10))                                   # expired
        _present(db, "e", "re", "s1", "other", ["web/app.ts"])                     # unrelated
        _present(db, "f", "rf", "s1", "fix/ledger", ["src/ledger/post.py"], repo=WEB)  # other repo

    await store.write(seed)
    live = await store.read(lambda db: presence.live_presence(db, repo=API, now=NOW))
    assert [(p.harness, p.session_id) for p in live] == [("a", "s1"), ("a", "s2"), ("b", "s1"), ("c", "s1"),
                                                         ("e", "s1")]
    found = await store.read(lambda db: presence.collisions(db, repo=API, now=NOW))
    pairs = [((c.first.harness, c.first.session_id), (c.second.harness, c.second.session_id),
              c.same_branch, c.shared_paths) for c in found]
    assert pairs == [
        (("a", "s1"), ("b", "s1"), True, ()),
        (("a", "s1"), ("c", "s1"), False, ("src/ledger", "src/ledger/post.py")),
        (("a", "s2"), ("b", "s1"), True, ()),
        (("a", "s2"), ("c", "s1"), False, ("src/ledger", "src/ledger/post.py")),
    ]
    assert not any(c.prospective for c in found)
    for_b = await store.read(lambda db: presence.collisions(db, repo=API, now=NOW, for_run=("b", "rb")))
    assert [(c.first.harness, c.second.harness, c.second.session_id) for c in for_b] == [
        ("b", "a", "s1"), ("b", "a", "s2"),
    ]
    # Later, every report has expired.
    assert await store.read(lambda db: presence.collisions(db, repo=API, now=NOW + timedelta(hours=1))) == []


@pytest.mark.req14
async def test_a_run_without_presence_gets_collisions_to_be(store: Store) -> None:
    def seed(db: Db) -> None:
        _present(db, "a", "ra", "s1", "fix/ledger", ["src/ledger/post.py"])
        _present(db, "b", "rb", "s1", "main", ["src/x.py"])
        _present(db, "n", "new", "s0", "fix/ledger", [], at=NOW - timedelta(hours=1))  # its own, expired

    await store.write(seed)
    on_branch = await store.read(lambda db: presence.collisions(
        db, repo=API, now=NOW, for_run=("n", "new"), branch="fix/ledger"
    ))
    assert [(c.second.harness, c.prospective, c.same_branch) for c in on_branch] == [("a", True, True)]
    assert on_branch[0].first.run_id == "new" and on_branch[0].first.session_id == ""
    anywhere = await store.read(lambda db: presence.collisions(db, repo=API, now=NOW, for_run=("n", "new")))
    assert [c.second.harness for c in anywhere] == ["a", "b"]


async def test_presence_report_replaces_and_clear_removes(store: Store) -> None:
    def seed(db: Db) -> presence.Presence:
        _present(db, "a", "ra", "s1", "main", ["x.py"])
        return presence.report_presence(db, harness="a", run_id="ra", session_id="s1", repo=API, branch="main",
                                     paths=["./b.py", "a.py", "a.py"], now=NOW + timedelta(seconds=30))

    latest = await store.write(seed)
    assert latest.paths == ("a.py", "b.py")
    assert latest.expires_at == iso(NOW + timedelta(seconds=330))
    assert await store.read(lambda db: presence.live_presence(db, repo=API, now=NOW)) == [latest]
    assert await store.read(lambda db: json.loads(db.execute("SELECT paths FROM presence").fetchone()[0])) == [
        "a.py", "b.py"
    ]
    assert await store.write(lambda db: presence.clear_presence(db, harness="a", run_id="ra")) == 1
    assert await store.read(lambda db: presence.live_presence(db, repo=API, now=NOW)) == []
    with pytest.raises(InvalidArgument):
        await store.write(lambda db: _present(db, "a", "ra", "s1", "main", [], ttl=0))


# ------------------------------------------------------------------------------------ caller identity


async def test_run_tokens_round_trip_and_unknown_tokens_are_unattributed(store: Store) -> None:
    token = await store.write(
        lambda db: run_tokens.mint_run_token(db, harness="api-fixer", run_id="r1", workdir="/w/api", now=NOW)
    )
    other = await store.write(
        lambda db: run_tokens.mint_run_token(db, harness="api-fixer", run_id="r2", workdir="/w/api", now=NOW)
    )
    assert token != other and len(token) >= 43
    assert await store.read(lambda db: run_tokens.resolve_run_token(db, token)) == run_tokens.Caller(
        "api-fixer", "r1", "/w/api"
    )
    assert await store.read(lambda db: run_tokens.resolve_run_token(db, token + "x")) is None
    assert await store.read(lambda db: run_tokens.resolve_run_token(db, "")) is None
    dump = await store.read(lambda db: db.execute("SELECT * FROM run_callers").fetchall())
    assert token not in json.dumps(dump)
    assert await store.write(lambda db: run_tokens.revoke_run_tokens(db, harness="api-fixer", run_id="r1")) == 1
    assert await store.read(lambda db: run_tokens.resolve_run_token(db, token)) is None
    assert (await store.read(lambda db: run_tokens.resolve_run_token(db, other))) is not None


# ----------------------------------------------------------------------------------- briefing cache


@pytest.mark.req15
async def test_briefing_cache_put_get_refresh_drop(store: Store) -> None:
    assert await store.read(lambda db: briefing_cache.get_cached_briefing(db, "h", "r1")) is None
    put = await store.write(lambda db: briefing_cache.put_cached_briefing(
        db, "h", "r1", "doc one", '{"v":1}', {"facts": 2, "collisions": 0}, NOW
    ))
    got = await store.read(lambda db: briefing_cache.get_cached_briefing(db, "h", "r1"))
    assert got == put and got is not None
    assert got.document == "doc one" and dict(got.items) == {"collisions": 0, "facts": 2}
    await store.write(lambda db: briefing_cache.put_cached_briefing(
        db, "h", "r1", "doc two", "{}", {}, NOW + timedelta(minutes=1)
    ))
    refreshed = await store.read(lambda db: briefing_cache.get_cached_briefing(db, "h", "r1"))
    assert refreshed is not None and refreshed.document == "doc two"
    assert refreshed.computed_at == iso(NOW + timedelta(minutes=1))
    assert await store.write(lambda db: briefing_cache.drop_cached_briefing(db, "h", "r1")) is True
    assert await store.write(lambda db: briefing_cache.drop_cached_briefing(db, "h", "r1")) is False
    assert await store.read(lambda db: briefing_cache.get_cached_briefing(db, "h", "r1")) is None
