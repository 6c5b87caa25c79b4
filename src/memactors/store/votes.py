"""Exposure and votes on facts (REQ-17; docs/contracts.md, "Exposure and votes"): which fact each surface showed to which run, and
the runs' votes, counted only when the voting run had not been shown the fact (independence)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal, get_args

import attrs

from ..errors import InvalidArgument
from . import Db
from ._feeds import at_text, clean
from .facts import UnknownFact, get_fact

Stance = Literal["support", "oppose"]
Surface = Literal["recall", "briefing_tool", "briefing_resource", "briefing_prompt"]

_SURFACES: frozenset[str] = frozenset(get_args(Surface))


@attrs.frozen
class Vote:
    """One vote on a fact. `counted` is false when the voting run had been shown the fact (independence)."""

    id: int
    fact_id: str
    run_id: str
    harness: str
    stance: Stance
    counted: bool
    at: str


@attrs.frozen
class VoteTally:
    """Counted support and oppose votes (one per run and stance) and every uncounted vote row."""

    support_counted: int
    oppose_counted: int
    uncounted: int


def record_exposure(
    db: Db,
    *,
    run_id: str,
    harness: str,
    fact_ids: Iterable[str],
    surface: Surface,
    call_id: str | None = None,
    now: datetime,
) -> int:
    """Write one exposure row per distinct fact served to the run on `surface` (REQ-17); returns the count.

    A prepended briefing uses surface `briefing_prompt` and no call id. Call it in the same write as
    serving, so a failure withholds both (withholding the facts when exposure cannot be written is the
    caller's rule).
    """
    if surface not in _SURFACES:
        raise InvalidArgument(
            "surface must be recall, briefing_tool, briefing_resource or briefing_prompt",
            field="surface",
            value=surface,
        )
    if not run_id or not harness:
        raise InvalidArgument("run_id and harness are required", field="run_id" if not run_id else "harness")
    run_id, harness = clean(run_id), clean(harness)
    at = at_text(now)
    ids = list(dict.fromkeys(fact_ids))
    db.executemany(
        "INSERT INTO exposures (run_id, harness, fact_id, surface, call_id, at) VALUES (?, ?, ?, ?, ?, ?)",
        [(run_id, harness, fid, surface, call_id, at) for fid in ids],
    )
    return len(ids)


def was_exposed(db: Db, run_id: str, fact_id: str) -> bool:
    """Whether any surface showed this fact to a run with this run id.

    Matching on run_id alone (not harness) errs towards not counting a vote, which is the safe side.
    """
    row = db.execute(
        "SELECT 1 FROM exposures WHERE run_id = ? AND fact_id = ? LIMIT 1", [run_id, fact_id]
    ).fetchone()
    return row is not None


def vote_stance(stance: str) -> Stance:
    """``stance`` as a Stance; InvalidArgument naming the field for any other string (the RPC's CastVote
    passes what the caller sent)."""
    match stance:
        case "support" | "oppose":
            return stance
    raise InvalidArgument("stance must be support or oppose", field="stance", value=stance)


def cast_vote(
    db: Db, *, fact_id: str, run_id: str, harness: str, stance: Stance, now: datetime
) -> Vote:
    """Store a vote; it is counted only if the run was never exposed to the fact (REQ-17).

    Raises InvalidArgument (stance) or UnknownFact.
    """
    vote_stance(stance)
    if get_fact(db, fact_id) is None:
        raise UnknownFact(fact=clean(fact_id)[:64])
    run_id, harness = clean(run_id), clean(harness)
    counted = not was_exposed(db, run_id, fact_id)
    at = at_text(now)
    (vote_id,) = db.execute(
        "INSERT INTO votes (fact_id, run_id, harness, stance, counted, at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        [fact_id, run_id, harness, stance, int(counted), at],
    ).fetchone()
    return Vote(int(vote_id), fact_id, run_id, harness, stance, counted, at)


def vote_tally(db: Db, fact_id: str) -> VoteTally:
    """Counted votes per stance, one per (harness, run), and the number of uncounted vote rows."""
    support, oppose, uncounted = db.execute(
        "SELECT"
        " (SELECT COUNT(*) FROM (SELECT DISTINCT harness, run_id FROM votes"
        "   WHERE fact_id = ? AND counted = 1 AND stance = 'support') AS s),"
        " (SELECT COUNT(*) FROM (SELECT DISTINCT harness, run_id FROM votes"
        "   WHERE fact_id = ? AND counted = 1 AND stance = 'oppose') AS o),"
        " (SELECT COUNT(*) FROM votes WHERE fact_id = ? AND counted = 0)",
        [fact_id, fact_id, fact_id],
    ).fetchone()
    return VoteTally(int(support), int(oppose), int(uncounted))
