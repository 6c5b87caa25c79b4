"""`memory recall` and `memory briefing` for a person at a terminal: the answer's structured form
(`structured`, the same sections and items as the agent's document) as a few lines per item — when, who,
outcome, what was done, which files, and one short line of provenance — instead of the agent-facing
document with its nonce lines and long provenance lines (that stays behind `--raw`, and is what a pipe
gets).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..humanize import absolute, ago, label

__all__ = ["readable"]

#: The parts of an item text after its gist (`documents.gist`): what it touched, its verify failures.
_TOUCHED = "touched "
_FAILURES = "verify failures: "
_SEP = re.compile(r" · ")
_SECTION_NAMES = {"episodes": "Episodes", "facts": "Facts", "recent_runs": "Recent runs", "collisions": "Collisions"}


def _split(text: str) -> tuple[str, str, str]:
    """(what was done, files, failures) of an item text; the text whole when it has no such parts."""
    said, files, failures = [], "", ""
    for part in _SEP.split(" ".join(text.split())):
        if part.startswith(_TOUCHED) and not files:
            files = part.removeprefix(_TOUCHED)
        elif part.startswith(_FAILURES) and not failures:
            failures = part.removeprefix(_FAILURES)
        else:
            said.append(part)
    return " · ".join(said), files, failures


def _when(p: Mapping[str, Any], now: datetime | None) -> str:
    for key in ("at", "ended", "updated", "reported"):
        if p.get(key):
            return f"{absolute(p[key])} ({ago(p[key], now)})"
    if p.get("age"):
        return f"{p['age']} ago"
    return ""


def _item(item: Mapping[str, Any], now: datetime | None) -> list[str]:
    p = dict(item.get("provenance") or {})
    kind = str(item.get("label") or "")
    head = [x for x in (_when(p, now), p.get("harness"), p.get("outcome")) if x]
    if kind == "fact":
        head = [x for x in (f"fact {p.get('fact', '')}".strip(), p.get("status"),
                            f"confidence {p['confidence']}" if p.get("confidence") else "") if x]
    if p.get("score"):
        head.append(f"score {p['score']}")
    lines = ["• " + "  ".join(str(x) for x in head) if head else f"• {kind}"]
    said, files, failures = _split(str(item.get("text") or ""))
    if said:
        lines.append(f"  {said}")
    if files or p.get("paths"):
        lines.append(f"  files: {files or p.get('paths')}")
    if failures:
        lines.append(f"  failures: {failures}")
    where = f"{p['repo']}@{p['branch']}" if p.get("repo") and p.get("branch") else p.get("repo") or p.get("branch")
    prov = [f"{kind} {p['episode']}" if p.get("episode") else "", f"run {p['run']}" if p.get("run") else "",
            str(where or ""), f"via {p['provider']}" if p.get("provider") else ""]
    if any(prov):
        lines.append("  " + " · ".join(x for x in prov if x))
    return lines


def readable(answer: Mapping[str, Any], *, now: datetime | None = None) -> str:
    """The answer (Recall's or GetBriefing's, with its ``structured`` document) for a person."""
    doc = answer.get("structured") or {}
    out: list[str] = []
    if doc.get("degraded") or answer.get("degraded"):
        out.append(f"(degraded: {doc.get('degraded') or answer.get('degraded')}; some memory may be missing)")
    for section in doc.get("sections") or ():
        items = section.get("items") or []
        name = _SECTION_NAMES.get(section.get("name"), label(section.get("name")))
        dropped = f", {section['dropped']} more left out to fit" if section.get("dropped") else ""
        if not items and not dropped:
            continue
        out.append(f"{name} ({len(items)}{dropped})")
        if section.get("note"):
            out.append(f"  ({label(section['note'])})")
        for item in items:
            out += _item(item, now)
        out.append("")
    if not out:
        return "nothing remembered for this yet\n"
    return "\n".join(out).rstrip("\n") + "\n"
