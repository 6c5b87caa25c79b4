"""What every operator feed in the store shares: how a time, a limit, a path and a caller's string are
checked and cleaned before they are stored or looked up (facts, votes, pull-request links, presence, run
tokens, the briefing cache)."""

from __future__ import annotations

from datetime import datetime

from ..errors import InvalidArgument
from ..redact import redact
from . import iso


def at_text(now: datetime) -> str:
    if now.tzinfo is None:
        raise InvalidArgument("now must be timezone-aware", field="now")
    return iso(now)


def checked_limit(limit: int, field: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgument(f"{field} must be a non-negative integer", field=field, value=limit)
    return limit


def normalise_path(path: str) -> str:
    p = path.strip()
    while p.startswith("./"):
        p = p[2:]
    return p.rstrip("/")


def overlaps(a: str, b: str) -> bool:
    """Same path, or one is a directory containing the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def like_prefix(path: str) -> str:
    escaped = path.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "/%"


def clean(value: str) -> str:
    """An operator-fed string as it is stored: secrets redacted, control characters stripped.

    Every feed below (facts, pull requests, presence, run tokens, votes, exposures) stores only cleaned
    strings and looks rows up by the cleaned form, so a credential pasted into a feed is never kept.
    """
    return redact(value)


def clean_opt(value: str | None) -> str | None:
    return None if value is None else clean(value)
