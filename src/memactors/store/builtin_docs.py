"""The built-in provider's documents as the store keeps them: the columns of `builtin_docs` and of its
full-text index, which both engines' migrations create (and SQLite's 0009 backfilled with these rules).

The built-in provider writes and ranks them (``memactors.builtin``); the engines migrate them. Both
import this module, so neither imports the other: it holds the fields of one episode's document
(:func:`doc_fields`), the full-text columns and their BM25 weights. May import: the pure modules
(``episode``, ``wrapper``), nothing of the provider.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..documents import ELLIPSIS, cut_at_word
from ..episode import drop_escape_remnants, flatten

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


def flat_strings(value: Any, flatten: Callable[[str], str]) -> Any:
    """`value` (JSON data) with `flatten` applied to every string in it."""
    if isinstance(value, str):
        return flatten(value)
    if isinstance(value, dict):
        return {k: flat_strings(v, flatten) for k, v in value.items()}
    if isinstance(value, list):
        return [flat_strings(v, flatten) for v in value]
    return value


#: builtin_docs' columns of agent-written text, the JSON one last (migration 0012 and PostgreSQL's 0005
#: rewrite them). Harness, branch and paths never held an escape: the boundary refuses control characters
#: in them (docs/contracts.md).
BUILTIN_TEXT_COLUMNS = ("title", "excerpt", "summary", "meta", "failures")


def words_stay_words(db: Any, placeholder: str = "?") -> None:
    """Migration `0012_words_stay_words` (SQLite) and `0005_words_stay_words` (PostgreSQL):
    what terminal escape sequences left in the stored text goes, and the built-in provider's documents
    are indexed again.

    Before it, the redactor removed an escape sequence's ESC alone (`\x1b[31mred` was stored
    `[31mred`) and a carriage return without a space (`line\rthird` became `linethird`). New text keeps
    words apart (`redact.strip_control`). Of what is stored, every string of every episode body and
    every text column of `builtin_docs` loses the escape remnants (`episode.drop_escape_remnants`);
    the changed documents are re-indexed (SQLite's FTS5 triggers, PostgreSQL's generated `tsv`). The
    words a removed CR joined cannot be told apart again: that text was never stored with the CR.
    Content hashes (the embedding cache's keys) are unchanged. `placeholder` is the engine's
    parameter mark; `db` anything with `execute(sql, params)` returning a cursor."""
    q = placeholder
    for body_id, body in db.execute("SELECT id, body FROM episode_bodies").fetchall():
        data = json.loads(body)
        clean = flat_strings(data, drop_escape_remnants)
        if clean != data:
            db.execute(f"UPDATE episode_bodies SET body = {q} WHERE id = {q}",
                       [json.dumps(clean, ensure_ascii=False, separators=(",", ":")), body_id])
    columns = ", ".join(BUILTIN_TEXT_COLUMNS)
    for doc_id, *values in db.execute(f"SELECT doc_id, {columns} FROM builtin_docs").fetchall():
        new = [drop_escape_remnants(v) for v in values[:-1]]
        failures = json.loads(values[-1])
        clean = flat_strings(failures, drop_escape_remnants)
        new.append(values[-1] if clean == failures else json.dumps(clean, ensure_ascii=False))
        if new != values:
            sets = ", ".join(f"{c} = {q}" for c in BUILTIN_TEXT_COLUMNS)
            db.execute(f"UPDATE builtin_docs SET {sets} WHERE doc_id = {q}", [*new, doc_id])
