"""Episodes stored before the fix with `result_excerpt` exactly `[prompt]` are repaired when
the daemon starts — the answer restored from the run's event log where it still holds it, else a mark
that says the answer is gone — on both engines, once (a second start changes nothing)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memactors.agents.excerpt_repair import LOST
from memactors.config import ConfigHolder
from memactors.service import open_memory_service
from memactors.store import agent_runs
from support import run_record, wait_ready

pytestmark = [pytest.mark.both_engines, pytest.mark.req5]

ANSWER = "All tests pass, nothing new to report."


def _agent_run(run_id: str, texts: list[str]) -> tuple[dict[str, object], list[dict[str, object]]]:
    view = {"harness": "api-fixer", "run_id": run_id, "state": "ended", "started_at": "2026-11-28T09:00:00.000000Z",
            "ended_at": "2026-11-28T09:10:00.000000Z"}
    events = [{"seq": n + 1, "at": "2026-11-28T09:05:00.000000Z", "kind": "text", "text": t} for n, t in enumerate(texts)]
    return view, events


async def test_a_prompt_excerpt_is_restored_from_the_runs_log_or_marked(
        engine: str, make_holder: Callable[[str], ConfigHolder]) -> None:
    holder = make_holder("")
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        ids = {}
        for run_id, texts in (("kept", ["working", ANSWER]), ("eaten", ["[prompt]"]), ("nolog", None),
                              ("fine", ["ok"])):
            result = "[prompt]" if run_id != "fine" else "fixed the ledger rounding"
            ids[run_id] = (await memory.ingest_run(run_record(run_id=run_id, result_text=result)))["episode_id"]
            if texts is not None:
                view, events = _agent_run(run_id, texts)
                await memory.store.write(lambda db, v=view, e=events: agent_runs.upsert(db, v, log=e))
    for _ in range(2):  # the repair runs at start; the second start finds nothing left to repair
        async with open_memory_service(holder) as memory:
            await wait_ready(memory)
            excerpts = {k: (await memory.get_episode(v))["episode"]["result_excerpt"] for k, v in ids.items()}
            assert excerpts == {"kept": ANSWER, "eaten": LOST, "nolog": LOST, "fine": "fixed the ledger rounding"}
            shown = (await memory.get_episode(ids["kept"]))["text"]
            assert f"result_excerpt: {ANSWER}" in shown  # the text rendering follows the body
