"""Values as people read them: dates relative and absolute, sizes in MB, durations and
costs in their units, yes/no for a flag, a dash for nothing, and names instead of field keys. Pure
functions shared by the console's templates and the CLI's human output, so neither prints a raw Python
value (``True``, ``None``, ``free_bytes 72991703040``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["DASH", "LABELS", "absolute", "parse_time", "ago", "cost", "day", "duration", "human", "label", "mb"]

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


def parse_time(value: Any) -> datetime | None:
    """A stored time (RFC 3339, `Z` or an offset; naive is UTC), or None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def ago(value: Any, now: datetime | None = None) -> str:
    """``3 h ago``, ``in 2 min``, ``just now``; a dash for no time, the text itself for one not a time."""
    at = parse_time(value)
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
    at = parse_time(value)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at is not None else (str(value) if value else DASH)


def day(value: Any) -> str:
    """The UTC day of a time: ``Sat 28 Nov 2026``."""
    at = parse_time(value)
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


def human(value: Any) -> Any:
    """Any value as text for people: yes/no, a dash for nothing, lists joined, mappings as ``k: v``
    (markup already made for people, a ``str`` subclass with ``__html__``, is passed through)."""
    if hasattr(value, "__html__"):
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
