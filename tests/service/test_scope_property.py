"""REQ-9 as a property: whatever a provider answers, nothing from a scope the caller may not see reaches
the caller, and every served provenance field is the index's.

Two levels: `filter_items` on a real SQLite store (many examples, fast), and the whole choke point —
a real provider session over an in-process mcp low-level Server that answers what hypothesis says,
the index actor and the briefing actor composing a recall document (fewer examples, each in its own
trio run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp.types as t
import pytest
import sqlite_utils
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.server import Server

from memactors import contract
from memactors.actors.briefing import Briefing, RecallRequest
from memactors.actors.index import Index, filter_items
from memactors.actors.provider_session import ProviderSession
from memactors.config import Config
from memactors.metrics import Metrics
from memactors.store.engines import open_store
from memactors.view import View
from support_readside import fixed_clock

PROVIDER = "fake"
REPOS = ("forge.example/acme/api", "forge.example/acme/billing", "forge.example/other/tool")
CALLER = REPOS[0]


def _episodes() -> list[dict[str, Any]]:
    """Indexed episodes: three per repository, the last of each forgotten; ids ep_<repo><n>."""
    rows = []
    for r, repo in enumerate(REPOS):
        for n in range(3):
            rows.append({
                "episode_id": f"ep_{r}{n}{'0' * 18}", "provider_id": f"pid-{r}-{n}", "harness": f"h{r}",
                "run_id": f"run{r}{n}", "repo": repo, "branch": f"b{n}", "scope": f"project:{repo}",
                "outcome": ("succeeded", "failed", "crashed")[n], "started_at": f"2026-11-0{n + 1}T00:00:00Z",
                "adapter": f"adapter{r}", "model": f"model{n}", "forgotten": n == 2,
            })
    return rows


EPISODES = _episodes()
BY_PID = {e["provider_id"]: e for e in EPISODES}
UNKNOWN = ("ep_ffffffffffffffffffff", "foreign-1", "pid-9-9")


def _seed(db: sqlite_utils.Database) -> None:
    for e in EPISODES:
        forgotten = "2026-11-20T00:00:00Z" if e["forgotten"] else None
        body_id = None if forgotten else db.execute(
            "INSERT INTO episode_bodies (body) VALUES (?)",
            [json.dumps({"adapter": e["adapter"], "model": e["model"]})]).lastrowid
        db.execute(
            "INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
            " started_at, recorded_at, body_id, forgotten_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [e["episode_id"], e["harness"], e["run_id"], e["repo"], e["branch"], e["scope"], "standard",
             e["outcome"], e["started_at"], e["started_at"], body_id, forgotten])
        db.execute("INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at, forgotten_at)"
                   " VALUES (?,?,?,?,?,?)", [PROVIDER, e["provider_id"], e["episode_id"], e["scope"],
                                             e["started_at"], forgotten])


@pytest.fixture(scope="module")
def db_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scope") / "memactors.db"

    async def build() -> None:
        store = await open_store(path)
        await store.write(_seed)
        store.close()

    trio.run(build)
    return path


# A provider answer: items with ids drawn from every scope, unknown ids, texts and scores (some invalid).
_ids = st.sampled_from([e["provider_id"] for e in EPISODES] + list(UNKNOWN)) | st.text(min_size=0, max_size=140)
_texts = st.text(alphabet="abcdefghij klm\n·<>\"", max_size=60) | st.just("x" * 2001)
_scores = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5)
_answers = st.lists(st.tuples(_ids, _texts, _scores), max_size=12)


def _payload(answer: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """The provider's items; each text carries an uppercase marker no generated text can contain."""
    items = []
    for k, (item_id, text, score) in enumerate(answer):
        item: dict[str, Any] = {"id": item_id, "text": f"MARK{k:03d}Z {text}"}
        if score is not None:
            item["score"] = score
        items.append(item)
    return {"items": items}


def _allowed(item_id: str) -> bool:
    e = BY_PID.get(item_id)
    return e is not None and not e["forgotten"] and e["repo"] == CALLER


def _check_provenance(provider_id: str, prov: dict[str, str] | Any) -> None:
    e = BY_PID[provider_id]
    get = (lambda k: prov[k]) if isinstance(prov, dict) else (lambda k: getattr(prov, k))
    assert (get("episode_id"), get("run_id"), get("harness"), get("adapter"), get("model"), get("repo"),
            get("branch"), get("outcome"), get("started_at")) == (
        e["episode_id"], e["run_id"], e["harness"], e["adapter"], e["model"], e["repo"], e["branch"],
        e["outcome"], e["started_at"])


@pytest.mark.req9
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_answers, limit=st.integers(1, 20))
def test_req9_filter_keeps_only_visible_items_with_the_index_provenance(
        db_path: Path, answer: list[tuple[str, str, Any]], limit: int) -> None:
    payload = _payload(answer)
    valid, invalid = contract.split_items(payload)
    db = sqlite_utils.Database(str(db_path))
    try:
        result = filter_items(db, provider=PROVIDER, items=valid, invalid=invalid,
                              visible_scopes=[f"project:{CALLER}"], limit=limit,
                              check_text=False)  # texts are made up here; text_belongs has its own tests
    finally:
        db.conn.close()
    texts = {}
    for item in valid:
        texts.setdefault(item.id, item.text)
    assert len(result.kept) <= limit
    for kept in result.kept:
        assert _allowed(kept.provider_id)
        _check_provenance(kept.provider_id, kept.provenance)
        assert kept.provenance.scope == f"project:{CALLER}"
        assert kept.text == texts[kept.provider_id]
    dropped = dict(result.dropped)
    assert dropped.get("invalid", 0) == invalid
    assert dropped.get("scope", 0) == sum(
        1 for i in valid if i.id in BY_PID and not BY_PID[i.id]["forgotten"] and BY_PID[i.id]["repo"] != CALLER)
    assert dropped.get("unknown_id", 0) == sum(1 for i in valid if i.id not in BY_PID)


def _fake_provider(answer: dict[str, Any], seen: list[dict[str, Any]]) -> Server[Any]:
    schemas = contract.load_schemas()

    async def list_tools(ctx: Any, params: Any) -> t.ListToolsResult:
        return t.ListToolsResult(tools=[t.Tool(name=n, input_schema=schemas[f"{n}.input"]) for n in contract.TOOLS])

    async def call_tool(ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
        args = dict(params.arguments or {})
        if params.name == "memory_contract":
            payload: dict[str, Any] = {"contract": 1, "provider": {"name": PROVIDER, "version": "1"}}
        elif params.name == "memory_recall":
            seen.append(args)
            payload = answer
        else:
            payload = {"ids": []} if params.name == "memory_record_episode" else {"forgotten": False}
        return t.CallToolResult(content=[t.TextContent(type="text", text=json.dumps(payload))],
                                structured_content=payload)

    return Server(PROVIDER, on_list_tools=list_tools, on_call_tool=call_tool)


async def _through_the_choke_point(db_path: Path, payload: dict[str, Any], view: View) -> tuple[Any, list]:
    store = await open_store(db_path)
    seen: list[dict[str, Any]] = []
    server = _fake_provider(payload, seen)
    metrics = Metrics()
    try:
        async with trio.open_nursery() as nursery:
            session = ProviderSession(provider=PROVIDER, target=lambda: server, store=store, metrics=metrics,
                                      provider_timeout=2.0, wall_clock=fixed_clock)
            await nursery.start(session.run)
            index = Index(store, wall_clock=fixed_clock)
            await nursery.start(index.run)
            briefing = Briefing(store=store, metrics=metrics, provider=PROVIDER, session_address=session.address,
                                index_address=index.address, config=Config, wall_clock=fixed_clock)
            await nursery.start(briefing.run)
            with trio.fail_after(60):
                while session.status().state != "ready":  # noqa: ASYNC110 -- the session's own state
                    await trio.sleep(0.005)
            answer = await briefing.recall(RecallRequest(view=view, query="anything", limit=20))
            nursery.cancel_scope.cancel()
    finally:
        store.close()
    return answer, seen


@pytest.mark.req9
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_answers)
def test_req9_no_provider_answer_widens_a_callers_scope(db_path: Path, answer: list[tuple[str, str, Any]]) -> None:
    payload = _payload(answer)
    view = View("run", "h0", "live-run", repo=CALLER, branch="main")
    result, seen = trio.run(_through_the_choke_point, db_path, payload, view)
    assert [s["scope"] for s in seen] == [[f"project:{CALLER}"]]
    episodes = next(s for s in result.json["sections"] if s["name"] == "episodes")["items"]
    served = {it["text"].split(" ", 1)[0] for it in episodes}
    for k, item in enumerate(payload["items"]):
        marker = f"MARK{k:03d}Z"
        if marker in served:
            continue
        # Only items the caller may see can be served; anything else never reaches the document.
        if not (isinstance(item["id"], str) and _allowed(item["id"])):
            assert marker not in result.text
    for it in episodes:
        p = it["provenance"]
        if it["text"].startswith("MARK"):  # the provider's own text, kept: the item it came from
            pids = [payload["items"][int(it["text"][4:7])]["id"]]
        else:  # served with the daemon's own text of the episode: an item that named it
            pids = [i["id"] for i in payload["items"] if isinstance(i["id"], str) and i["id"] in BY_PID
                    and BY_PID[i["id"]]["episode_id"] == p["episode"]]
            assert "MARK" not in it["text"]  # none of the provider's words
        assert pids and all(_allowed(pid) for pid in pids)
        _check_provenance(pids[0], {"episode_id": p["episode"], "run_id": p["run"], "harness": p["harness"],
                                    "adapter": p["adapter"], "model": p["model"], "repo": p["repo"],
                                    "branch": p["branch"], "outcome": p["outcome"], "started_at": p["at"]})
        assert p["provider"] == PROVIDER and it["untrusted"] is True


@pytest.mark.req9
def test_req9_an_unattributed_view_never_asks_the_provider(db_path: Path) -> None:
    payload = _payload([("pid-0-0", "hello", 1.0)])
    result, seen = trio.run(_through_the_choke_point, db_path, payload, View("unattributed"))
    assert seen == [] and "MARK000Z" not in result.text


@pytest.mark.req9
def test_req9_recheck_is_one_query_whatever_the_number_of_items(db_path: Path) -> None:
    """The re-check reads the index once per answer, not once per item."""
    items = [contract.RecallItem(id=e["provider_id"], text="t") for e in EPISODES] + [
        contract.RecallItem(id=u, text="t") for u in UNKNOWN]
    db = sqlite_utils.Database(str(db_path))
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    try:
        result = filter_items(db, provider=PROVIDER, items=items, invalid=0,
                              visible_scopes=[f"project:{CALLER}"], limit=20,
                              check_text=False)  # texts are made up here; text_belongs has its own tests
    finally:
        db.conn.close()
    assert [k.provider_id for k in result.kept] == ["pid-0-0", "pid-0-1"]
    assert dict(result.dropped) == {"forgotten": 3, "scope": 4, "unknown_id": 3}
    assert sum("memory_index" in s for s in statements) == 1
