"""The built-in provider's documents as the store keeps them: the columns of `builtin_docs` and of its
full-text index, which both engines' migrations create (and SQLite's 0009 backfilled with these rules).

The built-in provider writes and ranks them (``memactors.builtin``); the engines migrate them. Both
import this module, so neither imports the other: it holds the fields of one episode's document
(:func:`doc_fields`), the full-text columns and their BM25 weights. May import: the pure modules
(``episode``, ``wrapper``), nothing of the provider.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from ..episode import flatten
from ..wrapper import ELLIPSIS, cut_at_word

#: `builtin_fts`'s columns (migration 0009), in order: the scope token, then what the run said and
#: touched (the content columns), then its metadata (harness, adapter, model, repository, branch,
#: outcome, reason, run id, pull request), which every episode of a scope shares in part.
FTS_COLUMNS = ("scope_key", "title", "excerpt", "files", "failures", "meta")
CONTENT_COLUMNS = ("title", "excerpt", "files", "failures")
#: BM25 weight of each FTS column (the scope token weighs nothing): the run's first words (its summary,
#: else the start of its excerpt) count most, then the paths it touched (docs/benchmarks.md, "Recall
#: quality", says what each weight did).
BM25_WEIGHTS = (0.0, 3.0, 1.0, 1.5, 1.0, 0.25)

#: The `title` column: the summary, else the first TITLE_CHARS characters of the excerpt (cut between words).
TITLE_CHARS = 100


@attrs.frozen
class DocFields:
    """What the built-in provider indexes of one episode (builtin_docs' columns, migration 0009)."""

    title: str
    excerpt: str
    summary: str
    files: tuple[str, ...]
    failures: tuple[tuple[str, int], ...]
    meta: str
    harness: str
    branch: str
    outcome: str


#: REQ-5 fields whose words go into the `meta` column.
META_FIELDS = ("harness", "adapter", "model", "repo", "branch", "outcome", "reason", "run_id", "pull_request")
_OLD_ESCAPES = re.compile(r"\\(?:u2028|u2029|[nr\\])")
_FAILURE = re.compile(r"(.+?): (\d+)(?:, |$)")


def rendering_fields(text: str, *, escaped: bool = False) -> dict[str, str]:
    """The `name: value` lines of a REQ-5 rendering. `escaped`: a rendering from before migration 0009,
    whose line breaks were written `\\n` (read as a space) and backslashes `\\\\`."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        name, sep, value = line.partition(": ")
        if sep and name.isidentifier():
            if escaped:
                value = _OLD_ESCAPES.sub(lambda m: "\\" if m.group() == "\\\\" else " ", value)
            out.setdefault(name, value)
    return out


def doc_fields(text: str, episode: Mapping[str, Any] | None = None, *, escaped: bool = False) -> DocFields:
    """The fields to index for an episode: from its REQ-5 object where it has them, else from the lines
    of its rendering `text`; a text that is no rendering (no `result_excerpt` line) is the excerpt."""
    ep = dict(episode or {})
    lines = rendering_fields(text, escaped=escaped)

    def value(name: str) -> str:
        v = ep.get(name)
        if v is None:
            v = lines.get(name, "")
        return flatten(str(v)).strip()

    excerpt = value("result_excerpt") if "result_excerpt" in ep or "result_excerpt" in lines else flatten(text).strip()
    summary = value("summary")
    if isinstance(ep.get("files_touched"), (list, tuple)):
        files = tuple(flatten(str(f)) for f in ep["files_touched"])
    else:
        files = tuple(f for f in lines.get("files_touched", "").split(", ") if f)
    failures: tuple[tuple[str, int], ...]
    if isinstance(ep.get("verify_failures"), (list, tuple)):
        failures = tuple((flatten(str(f.get("error_class", ""))), int(f.get("count", 0)))
                         for f in ep["verify_failures"] if isinstance(f, Mapping))
    else:
        failures = tuple((m.group(1), int(m.group(2))) for m in _FAILURE.finditer(lines.get("verify_failures", "")))
    title = summary or cut_at_word(excerpt, TITLE_CHARS).removesuffix(ELLIPSIS)
    return DocFields(
        title=title, excerpt=excerpt, summary=summary, files=files, failures=failures,
        meta=" ".join(v for v in (value(name) for name in META_FIELDS) if v),
        harness=value("harness"), branch=value("branch"), outcome=value("outcome"),
    )
