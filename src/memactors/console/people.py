"""The console's template filters: ``humanize``'s values for people, a time as a ``<time>``
element (relative, the absolute time beside it), and a method's answer as rows for a done page."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from ..humanize import DASH, absolute, ago, cost, day, duration, human, label, mb, parse_time

__all__ = ["FILTERS", "result", "when"]


def when(value: Any, now: datetime | None = None) -> Markup:
    """A time as people read it: relative, with the absolute time beside it (a ``<time>`` element)."""
    at = parse_time(value)
    if at is None:
        return Markup("{}").format(DASH if not value else value)
    return Markup('<time datetime="{}" title="{}">{}</time> <span class="abs">({})</span>').format(
        at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), absolute(value), ago(value, now), absolute(value))


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
