"""The documents the briefing actor serves, built from rows: pure code, no I/O.

Item builders for each label (provenance only from the daemon's rows, provider text only as untrusted
item text), REQ-14's layout, the cached form's round trip, withholding facts when exposure cannot be
written, and the derived nonce that keeps a briefing byte-identical for the same store and now. The
actor (:mod:`memactors.actors.briefing`) gathers the rows and the provider's items and calls these.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from .. import graph
from ..errors import MemactorsError
from ..store import iso
from ..wrapper import BRIEFING_MAX_BYTES, Document, Item, Provenance, Section, fit_briefing, fit_recall
from .index import KeptItem

__all__ = [
    "BRIEFING_EPISODES",
    "BRIEFING_LAYOUT",
    "PROVIDER_UNAVAILABLE",
    "RECALL_POINTER",
    "collision_item",
    "counts",
    "derived_nonce",
    "document_from_json",
    "episode_item",
    "fact_ids",
    "fact_item",
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

    Used when writing exposure fails: SPEC-0028 withholds the facts rather than serve them unrecorded.
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


def fact_item(f: graph.Fact) -> Item:
    return Item(Provenance("fact", (
        ("fact", f.id), ("scope", f.scope), ("confidence", f"{f.confidence:.2f}"), ("status", f.status),
        ("updated", f.updated_at),
    )), f.text, untrusted=False)


def run_item(r: graph.RunRow) -> Item:
    return Item(Provenance("run", (
        ("run", r.run_id), ("harness", r.harness), ("adapter", r.adapter), ("outcome", r.outcome),
        ("branch", r.branch), ("ended", r.ended_at), ("duration_ms", r.duration_ms),
        ("pull_request", r.pull_request),
    )), "", untrusted=False)


def episode_item(provider: str, kept: KeptItem) -> Item:
    p = kept.provenance
    score = None if kept.score is None else f"{kept.score:.4g}"
    return Item(Provenance("episode", (
        ("provider", provider), ("episode", p.episode_id), ("run", p.run_id), ("harness", p.harness),
        ("adapter", p.adapter), ("model", p.model), ("repo", p.repo), ("branch", p.branch),
        ("outcome", p.outcome), ("at", p.started_at), ("score", score),
    )), kept.text, untrusted=True)


def collision_item(c: graph.Collision) -> Item:
    other = c.second
    return Item(Provenance("collision", (
        ("harness", other.harness), ("run", other.run_id), ("branch", other.branch),
        ("paths", ", ".join(c.shared_paths or other.paths)),
        ("same_branch", "yes" if c.same_branch else "no"), ("reported", other.reported_at),
    )), "", untrusted=False)


def derived_nonce(key: bytes, sections: Sequence[Section], now: datetime) -> str:
    """A nonce that is the same for the same content and now, and unpredictable without ``key``."""
    material = json.dumps(
        [[s.name, s.note, s.dropped, [[it.provenance.label, list(it.provenance.fields), it.text, it.untrusted]
                                      for it in s.items]] for s in sections] + [iso(now)],
        ensure_ascii=False,
    ).encode("utf-8", "surrogatepass")
    strings = [it.text for s in sections for it in s.items] + [
        v for s in sections for it in s.items for _, v in it.provenance.fields]
    for counter in range(64):
        nonce = hmac.new(key, material + counter.to_bytes(2, "big"), hashlib.sha256).hexdigest()[:16]
        if not any(nonce in t for t in strings) and nonce not in RECALL_POINTER:
            return nonce
    raise MemactorsError("no usable derived nonce after repeated attempts")
