"""Values as the console shows them to people (issue 40): dates relative and absolute, sizes in MB,
durations and costs in their units, yes/no for a flag, a dash for nothing, and names instead of field
keys. Pure functions, registered as the templates' filters, so no page prints a raw Python value
(``True``, ``None``, ``free_bytes 72991703040``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

__all__ = ["FILTERS", "ago", "cost", "day", "duration", "human", "label", "mb", "when"]

DASH = "—"

#: Field keys people read under another name (what a key is, not how it is spelled in JSON).
LABELS = {
    "memory_briefing": "briefing at session start",
    "free_bytes": "free space",
    "duration_ms": "duration",
    "cost_usd": "cost",
    "started_at": "started",
    "ended_at": "ended",
    "recorded_at": "recorded",
    "forgotten_at": "forgotten",
    "run_id": "run",
    "episode_id": "episode",
    "repo": "repository",
    "files_touched": "files touched",
    "verify_failures": "verify failures",
    "result_excerpt": "result",
    "pull_request": "pull request",
    "trust_class": "trust",
    "cost_source": "cost from",
    "trace_id": "trace",
    "daemon_id": "daemon",
}


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def ago(value: Any, now: datetime | None = None) -> str:
    """``3 h ago``, ``in 2 min``, ``just now``; a dash for no time, the text itself for one not a time."""
    at = _parse(value)
    if at is None:
        return DASH if not value else str(value)
    seconds = ((now or datetime.now(UTC)) - at).total_seconds()
    future, seconds = seconds < 0, abs(seconds)
    if seconds < 45:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = round(seconds / size)
            return f"in {n} {unit}" if future else f"{n} {unit} ago"
    return "just now"  # pragma: no cover - every span of 45 s or more has a unit above


def absolute(value: Any) -> str:
    """``2026-11-28 09:00 UTC``."""
    at = _parse(value)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at is not None else (str(value) if value else DASH)


def when(value: Any, now: datetime | None = None) -> Markup:
    """A time as people read it: relative, with the absolute time beside it (a ``<time>`` element)."""
    at = _parse(value)
    if at is None:
        return Markup("{}").format(DASH if not value else value)
    return Markup('<time datetime="{}" title="{}">{}</time> <span class="abs">({})</span>').format(
        at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), absolute(value), ago(value, now), absolute(value))


def day(value: Any) -> str:
    """The UTC day of a time: ``Sat 28 Nov 2026``."""
    at = _parse(value)
    return at.astimezone(UTC).strftime("%a %d %b %Y") if at is not None else DASH


def mb(value: Any) -> str:
    """Bytes as MB (GB from 10 GB on): ``69 611.3 MB`` reads worse than ``68.0 GB``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return DASH
    megabytes = value / 1_000_000
    if megabytes >= 10_000:
        return f"{megabytes / 1000:.1f} GB"
    return f"{megabytes:.1f} MB" if megabytes >= 0.1 or value == 0 else f"{value} bytes"


def duration(ms: Any) -> str:
    """Milliseconds as ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        return DASH
    if ms < 1000:
        return f"{int(ms)} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def cost(usd: Any) -> str:
    """US dollars as ``$0.0421``; a dash when unknown."""
    if not isinstance(usd, (int, float)) or isinstance(usd, bool):
        return DASH
    return f"${usd:.4f}" if usd < 1 else f"${usd:.2f}"


def human(value: Any) -> str | Markup:
    """Any value as text for people: yes/no, a dash for nothing, lists joined, mappings as ``k: v``."""
    if isinstance(value, Markup):
        return value
    if value is None or value == "":
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(human(v) for v in value) if value else DASH
    if isinstance(value, Mapping):
        return "; ".join(f"{label(k)}: {human(v)}" for k, v in value.items()) if value else DASH
    return str(value)


def label(key: Any) -> str:
    """A field key as people say it: ``memory_briefing`` → ``briefing at session start``."""
    text = str(key)
    return LABELS.get(text, text.replace("_", " "))


def result(value: Any) -> list[tuple[str, Any, list[dict[str, Any]] | None]]:
    """A method's answer (done pages) as rows for people: (label, value, table), where a list of
    objects (a provider check's checks) is a table of its rows, each value shown for people."""
    if not isinstance(value, Mapping):
        return [("result", human(value), None)]
    out: list[tuple[str, Any, list[dict[str, Any]] | None]] = []
    for key, v in value.items():
        if isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
            out.append((label(key), "", [{label(k): human(x) for k, x in row.items()} for row in v]))
        else:
            out.append((label(key), human(v), None))
    return out


FILTERS = {"ago": ago, "absolute": absolute, "when": when, "day": day, "mb": mb, "duration": duration,
           "cost": cost, "human": human, "label": label, "result_rows": result}
