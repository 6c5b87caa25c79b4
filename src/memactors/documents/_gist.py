"""An episode's gist: the few hundred characters an agent sees of it in a recall or a briefing.

One pure function, `gist(body, words, width)`, used by the built-in provider for its recall and
briefing items, by the TUI, and by whoever serves the daemon's own text of an episode. It reads the
stored REQ-5 object (the episode body) and writes, most useful first:

1. **The run's own words**: its summary when it has one, else the start of its result excerpt (an
   agent's first line, a commit's subject).
2. **The snippet around the query's words**, when they occur in the excerpt after what (1) shows:
   `… words around the match …`.
3. **What it touched, once**: `touched a/b.py, c/d.py, …` and `verify failures: test_failure ×2`.

No field names (`summary:`, `result_excerpt:`, `trust_class`), nothing the provenance line already
says (harness, run, repository, branch, outcome, ids, time), no escapes. Every word of the gist is a
word of the episode (REQ-9's text check, `actors.index.text_belongs_body`): text is only ever cut between
words (`cut_at_word`, the one word-boundary cut, made here where the item text is written; a briefing
places an item's text whole or drops the item, REQ-14), and the few words it adds (`touched`,
`verify`, `failures`) are the words of REQ-5's own field names `files_touched` and `verify_failures`, which every episode carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._fit import ELLIPSIS, cut_at_word

__all__ = ["gist", "lead", "matches"]

#: Widest the files part may be (the rest of the width goes to the run's own words).
FILES_CHARS = 90
#: Widest the verify-failures part may be.
FAILURES_CHARS = 60
#: Widest a snippet around the query's words may be.
SNIPPET_CHARS = 110
#: Words shown before the first matching word in a snippet.
SNIPPET_BEFORE = 4
#: Below this much room a part is left out rather than cut to a stub.
MIN_PART = 24
SEP = " · "

# A word as REQ-9's text check and FTS5's unicode61 tokenizer see it: letters and digits, "_" separates.
_WORD = re.compile(r"[^\W_]+")


def _norm(word: str) -> str:
    return word.casefold()


def matches(word: str, query_words: Iterable[str]) -> bool:
    """Whether a text word stands for one of the query's words: equal case-folded, or (as a stemmer
    would have it) sharing their first five letters, or the query word (3 letters or more) starting
    it — "rounding" finds "rounded", "auth" finds "authentication"."""
    w = _norm(word)
    for q in query_words:
        if w == q:
            return True
        if len(q) >= 3 and w.startswith(q):
            return True
        if len(w) >= 5 and len(q) >= 5 and w[:5] == q[:5]:
            return True
    return False


def _text(value: Any) -> str:
    # Whitespace runs as one space, ends stripped: what `re.sub(r"\s+", " ", value).strip()` gives (str's
    # whitespace and re's `\s` are the same characters), at a quarter of its cost on an excerpt.
    return " ".join(value.split()) if isinstance(value, str) else ""


def _failures(value: Any) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for f in value or ():
        if isinstance(f, Mapping):
            cls, n = f.get("error_class"), f.get("count")
        elif isinstance(f, (list, tuple)) and len(f) == 2:
            cls, n = f
        else:
            continue
        if isinstance(cls, str) and cls and isinstance(n, int):
            out.append((_text(cls), n))
    return out


def _first_line(value: Any) -> str:
    """What a text says first, on one line: its first line with words in it, and of that (stored text is
    flattened, REQ-6: a commit's subject runs into its body) what comes before the first sentence end,
    list bullet (`` * ``, `` - ``) or a pull request number that ends a squashed commit's subject
    (``(#123)``); the whole line when it has none. '' for none or not a string."""
    if not isinstance(value, str):
        return ""
    line = next((_text(part) for part in value.splitlines() if _WORD.search(part)), "")
    end = _SUBJECT_END.search(line, 4)
    return line[:end.start() + len(end.group(1) or "")] if end else line


# The end of a first sentence: a full stop, ! or ? before a space (kept), a pull request number (kept),
# or a list bullet after it (dropped).
_SUBJECT_END = re.compile(r"([.!?]|\(#\d+\))\s|()\s[*\-\u2022]\s")


def lead(body: Mapping[str, Any]) -> str:
    """The run's own words: its summary, else its result excerpt (whole; `gist` cuts it)."""
    return _text(body.get("summary")) or _text(body.get("result_excerpt"))


def _files_part(files: Sequence[str], width: int) -> str:
    return _list_part("touched ", list(files), width)


def _failures_part(failures: Sequence[tuple[str, int]], width: int) -> str:
    return _list_part("verify failures: ", [f"{cls} ×{n}" if n > 1 else cls for cls, n in failures], width)


def _list_part(label: str, pieces: Sequence[str], width: int) -> str:
    """`label` and as many of `pieces` as fit in `width`, comma-separated, with ", …" when some are left
    out (room for it is kept only while more are to come); '' when not even one fits."""
    if not pieces or width < MIN_PART:
        return ""
    out = label
    shown = 0
    for piece in pieces:
        piece = (", " if shown else "") + piece
        rest = len(pieces) - shown - 1
        if len(out) + len(piece) + (3 if rest else 0) > width:
            break
        out += piece
        shown += 1
    if not shown:
        return ""
    return out + (", …" if shown < len(pieces) else "")


def _snippet(text: str, start: int, words: Sequence[str], width: int) -> str:
    """A window of `text` from `start` on that holds the first word matching `words`, or ''."""
    for m in _WORD.finditer(text, start):
        if matches(m.group(), words):
            break
    else:
        return ""
    # back up SNIPPET_BEFORE words (to a space), never before `start`
    begin = m.start()
    for _ in range(SNIPPET_BEFORE):
        prev = text.rfind(" ", start, max(begin - 1, start))
        if prev < 0:
            begin = start
            break
        begin = prev + 1
    while begin > start and text[begin - 1] != " ":
        begin -= 1
    window = cut_at_word(text[begin:], width - 2)
    if not window:
        return ""
    return (ELLIPSIS if begin > 0 else "") + window


def gist(body: Mapping[str, Any], words: Sequence[str] = (), width: int = 320, *, subject: bool = False) -> str:
    """An episode's gist for an item, at most `width` characters (see the module docstring).

    `body` is the stored REQ-5 object (its `summary`, `result_excerpt`, `files_touched` and
    `verify_failures` are read; a missing one is empty), `words` the query's words (lower-cased; none
    for a briefing or a path-only hit). With `subject` (a briefing's short item) the run's
    own words are the first line of its summary or excerpt only (a commit's subject, an agent's
    opening sentence), and what it touched gets what the subject leaves (a third of the width at least).
    """
    words = [_norm(w) for w in words if w]
    summary = _first_line(body.get("summary")) if subject else _text(body.get("summary"))
    excerpt = _first_line(body.get("result_excerpt")) if subject else _text(body.get("result_excerpt"))
    files = [p for p in (body.get("files_touched") or ()) if isinstance(p, str) and p]
    if subject:  # the files in a folder first: `src/ledger.py` says more than `CHANGELOG.md`
        files.sort(key=lambda p: "/" not in p)
    failures = _failures(body.get("verify_failures"))
    own = summary or excerpt

    # What it touched comes last but its room is set aside first (bounded), unless the run's words
    # alone fill the width anyway.
    # (A briefing's short item: the subject's room first; what it touched gets the rest, a third at least.)
    third = width // 3
    if subject:
        third = max(width - len(summary or excerpt) - len(SEP), third)
    tail_room = min(FILES_CHARS + FAILURES_CHARS + len(SEP), max(third, 0))
    fail_part = _failures_part(failures, min(FAILURES_CHARS, tail_room))
    files_part = _files_part(files, min(FILES_CHARS, tail_room - (len(fail_part) + len(SEP) if fail_part else 0)))
    tail = SEP.join(p for p in (files_part, fail_part) if p)
    room = width - (len(tail) + len(SEP) if tail else 0)

    head = ""
    if own and room >= MIN_PART:
        # The snippet: the query's words in the excerpt, after what the lead shows.
        shown = cut_at_word(own, room)
        shown_len = len(shown) - (1 if shown.endswith(ELLIPSIS) else 0)
        snippet = ""
        if words and not any(matches(w, words) for w in _WORD.findall(shown)):
            src = excerpt
            start = 0 if summary else shown_len
            snippet = _snippet(src, start, words, min(SNIPPET_CHARS, room // 2))
        if snippet:
            first = cut_at_word(own, room - len(snippet) - len(SEP))
            glue = " " if snippet.startswith(ELLIPSIS) else SEP
            head = f"{first}{glue}{snippet}" if first else snippet
        else:
            head = shown
    if not head:
        return cut_at_word(tail, width) if tail else ""
    return f"{head}{SEP}{tail}" if tail else head
