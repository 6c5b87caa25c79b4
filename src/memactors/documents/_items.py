"""The items of a recall answer or a briefing, built from the daemon's rows: pure code, no I/O.

Item builders for each label (provenance only from the daemon's rows, provider text only as untrusted
item text), REQ-14's layout, the cached form's round trip, withholding facts when exposure cannot be
written, and the derived nonce that keeps a briefing byte-identical for the same store and now. The
briefing actor (:mod:`memactors.actors.briefing`) gathers the rows and the provider's items and calls
these.

What keeps an answer readable lives here too: near-duplicate facts collapse into one
(:func:`collapse_facts`, in recall and briefings alike); a briefing's episode items carry a one-line
provenance (run, harness, outcome, age: :func:`briefing_episode_item`) so that the provider's text has
the room of REQ-14's episodes share (each item placed whole or dropped whole, never shortened), while
the full provenance stays in recall (:func:`episode_item`); and an empty run never takes a briefing's
episode slot (:func:`is_empty_run`).

The rows are read through the Protocols below (what each builder reads of a fact, a run, a presence
collision and a kept recall item), which the store's and the index actor's row classes satisfy: this
module sits with the document format, below the store and the actors that produce the rows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

import attrs

from .. import contract
from ..errors import MemactorsError
from ._fit import BRIEFING_MAX_BYTES, fit_briefing, fit_recall
from ._gist import gist
from ._model import Document, Item, Provenance, Section


class FactLike(Protocol):
    """What a fact item shows of a fact (``store.facts.Fact`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def confidence(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def updated_at(self) -> str: ...


class RunLike(Protocol):
    """What a run item shows of a run (``store.run_history.RunRow`` is one)."""

    @property
    def run_id(self) -> str: ...
    @property
    def harness(self) -> str: ...
    @property
    def adapter(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def branch(self) -> str | None: ...
    @property
    def ended_at(self) -> str: ...
    @property
    def duration_ms(self) -> int: ...
    @property
    def pull_request(self) -> str | None: ...


class SessionLike(Protocol):
    """What a collision item shows of the other session (``store.presence.Presence`` is one)."""

    @property
    def harness(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def branch(self) -> str | None: ...
    @property
    def paths(self) -> tuple[str, ...]: ...
    @property
    def reported_at(self) -> str: ...


class CollisionLike(Protocol):
    """What a collision item shows (``store.presence.Collision`` is one)."""

    @property
    def second(self) -> SessionLike: ...
    @property
    def same_branch(self) -> bool: ...
    @property
    def shared_paths(self) -> tuple[str, ...]: ...


class EpisodeProvenanceLike(Protocol):
    """An episode's provenance from the daemon's row (``actors.index.Provenance`` is one)."""

    @property
    def episode_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def harness(self) -> str: ...
    @property
    def adapter(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def repo(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def started_at(self) -> str: ...


class KeptLike(Protocol):
    """A provider's recall item the daemon kept, with its own stored episode (``actors.index.KeptItem``
    is one)."""

    @property
    def text(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def provenance(self) -> EpisodeProvenanceLike: ...
    @property
    def episode(self) -> Mapping[str, Any]: ...


F = TypeVar("F", bound=FactLike)
K = TypeVar("K", bound=KeptLike)

__all__ = [
    "BRIEFING_CANDIDATES",
    "BRIEFING_EPISODES",
    "BRIEFING_LAYOUT",
    "FACT_POOL",
    "NEAR_DUPLICATE",
    "PROVIDER_UNAVAILABLE",
    "RECALL_POINTER",
    "RECENT_RUNS",
    "RECENT_RUNS_POOL",
    "age",
    "briefing_episode_item",
    "collapse_facts",
    "collision_item",
    "counts",
    "derived_nonce",
    "document_from_json",
    "episode_item",
    "fact_ids",
    "fact_item",
    "briefing_run_item",
    "collapse_episodes",
    "is_empty_run",
    "is_trivial_run",
    "run_item",
    "withhold_facts",
]

#: REQ-14: (section, max items, share of briefing_max_chars), in order.
BRIEFING_LAYOUT: tuple[tuple[str, int, float], ...] = (
    ("collisions", 10, 0.25),
    ("recent_runs", 5, 0.25),
    ("facts", 8, 0.35),
    ("episodes", 3, 0.25),
)
BRIEFING_EPISODES = 3
#: How many episodes a briefing asks the provider for: its 3 slots and spares, so that the slots still
#: fill when some candidates are empty runs (a launch that failed at once), which never take a slot.
#: The most memory_recall allows (REQ-12's limit): a harness whose agent CLI fails at once leaves a
#: burst of empty runs, newest first, and up to 17 of them are skipped (bench/briefing_path.py: the
#: agent path costs about the same with 20 as with 3).
BRIEFING_CANDIDATES = contract.MAX_LIMIT
#: Facts whose word sets are at least this similar (Jaccard: shared words over all words) are
#: near-duplicates, shown once in an answer.
NEAR_DUPLICATE = 0.8
#: How many facts of the query's order are looked at per slot, so an answer still fills its slots
#: after collapsing near-duplicates.
FACT_POOL = 4
PROVIDER_UNAVAILABLE = "provider_unavailable"
RECALL_POINTER = "use the recall tool for more"


def fact_ids(doc: Document) -> tuple[str, ...]:
    return tuple(
        dict(it.provenance.fields)["fact"]
        for s in doc.sections if s.name == "facts"
        for it in s.items
    )


def counts(doc: Document) -> dict[str, int]:
    return {s.name: len(s.items) for s in doc.sections}


def document_from_json(data: Mapping[str, Any]) -> Document:
    """Rebuild a :class:`Document` from :func:`render_json` output (the cached form of a briefing)."""
    sections = tuple(
        Section(
            name=s["name"],
            items=tuple(
                Item(Provenance(it["label"], tuple(it["provenance"].items())), it["text"], bool(it["untrusted"]))
                for it in s["items"]
            ),
            dropped=int(s["dropped"]),
            note=s["note"],
        )
        for s in data["sections"]
    )
    return Document(data["kind"], sections, data["nonce"], data["degraded"], int(data["truncated"]),
                    data["pointer"])


def withhold_facts(doc: Document, *, max_chars: int | None = None) -> Document:
    """The same document with its facts section emptied (counted as not shown), refitted to its cap.

    Used when writing exposure fails: the facts are withheld rather than
    served unrecorded: a run's vote on a fact it was shown is not counted, and without the exposure row
    it would be (docs/contracts.md, "Exposure and votes").
    """
    sections = tuple(
        attrs.evolve(s, items=(), dropped=s.dropped + len(s.items)) if s.name == "facts" else s
        for s in doc.sections
    )
    if doc.kind == "recall":
        return fit_recall(sections, degraded=doc.degraded, nonce=doc.nonce, wire=True)
    layout = {name: (n, share) for name, n, share in BRIEFING_LAYOUT}
    return fit_briefing(
        [(s, layout[s.name][0], layout[s.name][1]) for s in sections],
        max_chars=max_chars or BRIEFING_MAX_BYTES, degraded=doc.degraded, nonce=doc.nonce,
        recall_pointer=doc.pointer or RECALL_POINTER,
    )


def fact_item(f: FactLike, similar: int = 0) -> Item:
    """A fact; ``similar`` counts the near-duplicates collapsed into it (`collapse_facts`), shown as
    ``similar N`` when there were any."""
    return Item(Provenance("fact", (
        ("fact", f.id), ("scope", f.scope), ("confidence", f"{f.confidence:.2f}"), ("status", f.status),
        ("updated", f.updated_at), ("similar", similar or None),
    )), f.text, untrusted=False)


_WORD = re.compile(r"[^\W_]+")  # letters and digits, as FTS5's unicode61 and REQ-9's text check see words


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.casefold()))


def _near(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return a == b
    return len(a & b) >= NEAR_DUPLICATE * len(a | b)


def collapse_facts(facts: Sequence[F], limit: int) -> list[tuple[F, int]]:
    """Near-duplicate facts of one answer as one: up to ``limit`` (fact, similar) pairs.

    Two facts are near-duplicates when their word sets (letters and digits, case-folded) share at
    least ``NEAR_DUPLICATE`` of all their words (Jaccard similarity ≥ 0.8): roughly, at most one word
    in ten differs. A fact joins the first group, in the answer's order, holding a member it is near;
    each group is shown once, at its first member's place, as its highest-confidence member (the
    earlier on a tie), with ``similar`` the number of the others. Deterministic for the same input.
    """
    words = [_words(f.text) for f in facts]
    groups: list[list[int]] = []
    for i, w in enumerate(words):
        home = next((g for g in groups if any(_near(w, words[j]) for j in g)), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    out: list[tuple[F, int]] = []
    for g in groups[: max(limit, 0)]:
        best = min(g, key=lambda j: (-facts[j].confidence, j))
        out.append((facts[best], len(g) - 1))
    return out


#: Characters of a briefing's recent_runs line's gist (the run's own words, then what it touched).
RUN_GIST_CHARS = 120
#: How many of the newest runs on the branch a briefing looks through for its recent_runs lines, the
#: trivial ones (`is_trivial_run`) left out.
RECENT_RUNS_POOL = 25
#: recent_runs lines in a briefing (REQ-14).
RECENT_RUNS = 5


def run_item(r: RunLike) -> Item:
    return Item(Provenance("run", (
        ("run", r.run_id), ("harness", r.harness), ("adapter", r.adapter), ("outcome", r.outcome),
        ("branch", r.branch), ("ended", r.ended_at), ("duration_ms", r.duration_ms),
        ("pull_request", r.pull_request),
    )), "", untrusted=False)


def briefing_run_item(r: RunLike, episode: Mapping[str, Any] | None, now: datetime) -> Item:
    """A run as a briefing's recent_runs shows it: a short provenance line from the daemon's runs row
    (run, harness, outcome, age at ``now``, pull request) and, given its stored episode, the episode's
    gist (what it said and touched: a line of provenance alone tells a reader nothing),
    fenced as untrusted like every agent-written text. The full provenance is recall's (`run_item`)."""
    text = gist(episode, (), RUN_GIST_CHARS, subject=True) if episode else ""
    return Item(Provenance("run", (
        ("run", r.run_id), ("harness", r.harness), ("outcome", r.outcome), ("age", age(r.ended_at, now)),
        ("pull_request", r.pull_request),
    )), text, untrusted=bool(text))


def collapse_episodes(items: Sequence[K]) -> list[tuple[K, int]]:
    """Near-duplicate episodes of one answer as one (retries of one task would fill an answer's
    slots with one fact): (item, runs) pairs in the answer's order, ``runs`` the number of episodes the
    item stands for.

    Judged from the daemon's own stored episodes (`KeptLike.episode`), never from provider text: two
    episodes are near-duplicates when the words of what they said (summary, else result excerpt) are
    ``NEAR_DUPLICATE`` alike (Jaccard ≥ 0.8) and they touched the same files. An episode joins the
    first group holding a member it is near; each group is shown at its first member's place, as that
    member (the provider's best of them), with its own provenance. An episode that said nothing is
    never a duplicate."""
    files = [frozenset(str(f) for f in k.episode.get("files_touched") or ()) for k in items]
    said: dict[int, frozenset[str]] = {}

    def words(i: int) -> frozenset[str]:
        # Only for episodes that touched the same files as another: splitting every item's text into
        # words cost more than the rest of the collapse.
        if i not in said:
            ep = items[i].episode
            said[i] = _words(str(ep.get("summary") or ep.get("result_excerpt") or ""))
        return said[i]

    groups: list[list[int]] = []
    for i in range(len(items)):
        home = next((g for g in groups
                     if any(files[j] == files[i] and words(i) and words(j) and _near(words(i), words(j)) for j in g)),
                    None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    return [(items[g[0]], len(g)) for g in groups]


def episode_item(provider: str, kept: KeptLike, runs: int = 1) -> Item:
    """An episode as recall serves it: the full provenance from the daemon's rows, ``runs N`` when it
    stands for N near-duplicate episodes (`collapse_episodes`), then the provider's text (untrusted)."""
    p = kept.provenance
    score = None if kept.score is None else f"{kept.score:.4g}"
    return Item(Provenance("episode", (
        ("provider", provider), ("episode", p.episode_id), ("run", p.run_id), ("harness", p.harness),
        ("adapter", p.adapter), ("model", p.model), ("repo", p.repo), ("branch", p.branch),
        ("outcome", p.outcome), ("at", p.started_at), ("score", score), ("runs", runs if runs > 1 else None),
    )), kept.text, untrusted=True)


def age(started_at: str, now: datetime) -> str | None:
    """How long before ``now`` a run started, in one short token: ``40m``, ``5h`` (under two days),
    ``12d``; None when ``started_at`` is not a time. A start after ``now`` (clock skew) is ``0m``."""
    try:
        started = datetime.fromisoformat(started_at)
    except ValueError:
        return None
    if started.tzinfo is None:
        return None
    seconds = max((now - started).total_seconds(), 0)
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)}h"
    return f"{int(seconds // 86400)}d"


def is_empty_run(episode: Mapping[str, Any]) -> bool:
    """Whether a stored episode (its REQ-5 body) records nothing a later run could use: an agent CLI
    that exited at once (a refused flag, a missing key). Its reason is ``launch_failed``, or it has no
    result text, no summary, no files touched and no verify failures. Such a run never takes a
    briefing's episode slot; it is judged from the daemon's own episode, never from provider text."""
    if episode.get("reason") == "launch_failed":
        return True
    return not (str(episode.get("result_excerpt") or "").strip() or episode.get("summary")
                or episode.get("files_touched") or episode.get("verify_failures"))


def is_trivial_run(episode: Mapping[str, Any]) -> bool:
    """Whether a stored episode is not worth a briefing's slot: an empty run
    (`is_empty_run`), or one that edited nothing, failed no verification and answered in one short
    line (a `claude -p "hello"`). Judged from the daemon's own episode."""
    if is_empty_run(episode):
        return True
    if episode.get("files_touched") or episode.get("verify_failures"):
        return False
    said = str(episode.get("summary") or episode.get("result_excerpt") or "").strip()
    return "\n" not in said and len(said) <= TRIVIAL_CHARS


#: A run that touched no file and failed nothing is trivial when all it said fits in this many characters.
TRIVIAL_CHARS = 80


def briefing_episode_item(kept: KeptLike, now: datetime) -> Item:
    """An episode as a briefing shows it: one short provenance line (run, harness, outcome, age at
    ``now``), all from the daemon's episode row, then the provider's text (untrusted), whole. The
    full provenance is recall's (`episode_item`)."""
    p = kept.provenance
    return Item(Provenance("episode", (
        ("run", p.run_id), ("harness", p.harness), ("outcome", p.outcome), ("age", age(p.started_at, now)),
    )), kept.text, untrusted=True)


def collision_item(c: CollisionLike) -> Item:
    other = c.second
    return Item(Provenance("collision", (
        ("harness", other.harness), ("run", other.run_id), ("branch", other.branch),
        ("paths", ", ".join(c.shared_paths or other.paths)),
        ("same_branch", "yes" if c.same_branch else "no"), ("reported", other.reported_at),
    )), "", untrusted=False)


def derived_nonce(key: bytes, sections: Sequence[Section]) -> str:
    """A nonce that is the same for the same content, and unpredictable without ``key``.

    Derived from the content alone, not from the instant it was composed: two previews of
    the same store whose documents say the same thing are byte-identical however many milliseconds
    apart they were asked for (REQ-14 "Deterministic without the provider"). Whatever ``now`` changes in
    a document (an episode's age, a collision that expired) is content, so it changes the nonce too.
    Text that learns one document's nonce cannot use it: a document containing it is other content,
    with another nonce (and a derived nonce found in the content is re-derived)."""
    material = json.dumps(
        [[s.name, s.note, s.dropped, [[it.provenance.label, list(it.provenance.fields), it.text, it.untrusted]
                                      for it in s.items]] for s in sections],
        ensure_ascii=False,
    ).encode("utf-8", "surrogatepass")
    strings = [it.text for s in sections for it in s.items] + [
        v for s in sections for it in s.items for _, v in it.provenance.fields]
    for counter in range(64):
        nonce = hmac.new(key, material + counter.to_bytes(2, "big"), hashlib.sha256).hexdigest()[:16]
        if not any(nonce in t for t in strings) and nonce not in RECALL_POINTER:
            return nonce
    raise MemactorsError("no usable derived nonce after repeated attempts")
