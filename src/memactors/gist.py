"""An episode's gist: the few hundred characters an agent sees of it in a recall or a briefing (issue 17).

One pure function, `gist(body, words, width)`, used by the built-in provider for its recall and
briefing items, by the TUI, and by whoever serves the daemon's own text of an episode. It reads the
stored REQ-5 object (the episode body) and writes, most useful first, so a briefing that composes a
shorter one of its whole parts (`compose`, below) keeps the best of it:

1. **The run's own words**: its summary when it has one, else the start of its result excerpt (an
   agent's first line, a commit's subject).
2. **The snippet around the query's words**, when they occur in the excerpt after what (1) shows:
   `… words around the match …`.
3. **What it touched, once**: `touched a/b.py, c/d.py, …` and `verify failures: test_failure ×2`.

No field names (`summary:`, `result_excerpt:`, `trust_class`), nothing the provenance line already
says (harness, run, repository, branch, outcome, ids, time), no escapes. Every word of the gist is a
word of the episode (REQ-9's text check, `index.text_belongs_body`): text is only ever cut between
words (`wrapper.cut_at_word`, the one word-boundary cut; a briefing never cuts again but composes a
shorter gist of whole sentences, paths and failure classes: `compose`), and
the few words it adds (`touched`, `verify`, `failures`) are the words of REQ-5's own field
names `files_touched` and `verify_failures`, which every episode carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .wrapper import ELLIPSIS, cut_at_word

__all__ = ["compose", "gist", "lead", "matches", "whole_parts"]

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
_SPACE = re.compile(r"\s+")


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
    return _SPACE.sub(" ", value).strip() if isinstance(value, str) else ""


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


def gist(body: Mapping[str, Any], words: Sequence[str] = (), width: int = 320) -> str:
    """An episode's gist for an item, at most `width` characters (see the module docstring).

    `body` is the stored REQ-5 object (its `summary`, `result_excerpt`, `files_touched` and
    `verify_failures` are read; a missing one is empty), `words` the query's words (lower-cased; none
    for a briefing or a path-only hit).
    """
    words = [_norm(w) for w in words if w]
    summary = _text(body.get("summary"))
    excerpt = _text(body.get("result_excerpt"))
    files = [p for p in (body.get("files_touched") or ()) if isinstance(p, str) and p]
    failures = _failures(body.get("verify_failures"))
    own = summary or excerpt

    # What it touched comes last but its room is set aside first (bounded), unless the run's words
    # alone fill the width anyway.
    tail_room = min(FILES_CHARS + FAILURES_CHARS + len(SEP), max(width // 3, 0))
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


# --- a shorter gist of whole parts (REQ-14: a briefing's episode items, issue 33) ------------------------

#: The labels of the gist's list parts: what follows is a list of whole pieces joined by ", ".
LIST_LABELS = ("touched ", "verify failures: ")
#: What separates an item text's parts: the gist's separator, or a line break (a provider's own text).
_SEGMENT = re.compile(r"( · |\n+)")
#: Where prose is split into whole sentences: after `.`, `!` or `?` and the space that follows.
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@attrs.frozen
class Part:
    """One part of an item text: prose (``label`` empty; ``pieces`` its whole sentences) or a list
    (``label`` ``touched `` or ``verify failures: ``; ``pieces`` its whole entries, ``more`` when the text
    already left some out with ``, …``). ``sep`` is what came before it in the text."""

    sep: str
    label: str
    pieces: tuple[str, ...]
    more: bool = False


def whole_parts(text: str) -> tuple[Part, ...]:
    """``text`` as whole parts: its segments (between `` · `` or line breaks), each prose segment as its
    whole sentences and each list as its whole entries.

    What is not whole is left out: a sentence ending in ``…`` (cut by whoever wrote the text: the gist's
    own word-boundary cut, a provider's) and everything after it in its segment, a snippet (a window
    that starts with ``…``), a list entry ending in ``…``. A list's closing ``, …`` is not an entry: it
    says entries were left out, and is kept as ``more``."""
    parts: list[Part] = []
    sep = ""
    for i, chunk in enumerate(_SEGMENT.split(text)):
        if i % 2:
            sep = chunk if chunk == SEP else "\n"
            continue
        segment = chunk.strip()
        label = next((lb for lb in LIST_LABELS if segment.startswith(lb)), None)
        if label is not None:
            entries = [e.strip() for e in segment[len(label):].split(", ")]
            more = bool(entries) and entries[-1] == ELLIPSIS
            whole = tuple(e for e in entries[: len(entries) - more] if e and ELLIPSIS not in e)
            if whole:
                parts.append(Part(sep, label, whole, more or len(whole) < len(entries) - more))
            continue
        sentences: list[str] = []
        for sentence in _SENTENCE.split(segment):
            if not sentence:
                continue
            if sentence.startswith(ELLIPSIS) or sentence.endswith(ELLIPSIS):
                break  # cut text, and what follows it has lost its context
            sentences.append(sentence)
        if sentences:
            parts.append(Part(sep, "", tuple(sentences)))
    return tuple(parts)


def _render(parts: Sequence[Part], shown: Sequence[int]) -> str:
    out = ""
    for part, k in zip(parts, shown, strict=True):
        if not k:
            continue
        if part.label:
            more = k < len(part.pieces) or part.more
            body = part.label + ", ".join(part.pieces[:k]) + (", " + ELLIPSIS if more else "")
        else:
            body = " ".join(part.pieces[:k])
        out += (part.sep if out else "") + body
    return out


def compose(text: str, max_chars: int, max_bytes: int) -> str:
    """The longest shorter gist of ``text`` made of whole parts (`whole_parts`) that fits in
    ``max_chars`` characters and ``max_bytes`` UTF-8 bytes; ``""`` when not even one part fits (the
    item is then dropped whole). Never a cut: every sentence, path and failure class shown is whole;
    ``, …`` after a list's last entry only says entries were left out.

    The parts are chosen as the gist chooses them: what the run touched and its failures get up to a
    third of the room first (their first entries), then the run's own words take whole sentences in
    order, then the lists take what is left. Text that fits whole (its whole parts) is returned as such.
    """
    parts = whole_parts(text)

    def fits(shown: Sequence[int]) -> bool:
        t = _render(parts, shown)
        return len(t) <= max_chars and len(t.encode("utf-8", "surrogatepass")) <= max_bytes

    full = [len(p.pieces) for p in parts]
    if fits(full):
        return _render(parts, full)
    shown = [0] * len(parts)
    lists = [i for i, p in enumerate(parts) if p.label]
    prose = [i for i, p in enumerate(parts) if not p.label]

    def tail_fits(shown: Sequence[int]) -> bool:
        return len(_render(parts, [k if parts[i].label else 0 for i, k in enumerate(shown)])) <= max_chars // 3

    def grow(indices: Sequence[int], ok: Any, *, in_order: bool) -> None:
        for i in indices:
            while shown[i] < len(parts[i].pieces):
                shown[i] += 1
                if not ok(shown):
                    shown[i] -= 1
                    break
            if in_order and shown[i] < len(parts[i].pieces):
                return  # the run's words in order: a later paragraph never follows an unfinished one

    grow(lists, lambda sh: fits(sh) and tail_fits(sh), in_order=False)
    grow(prose, fits, in_order=True)
    grow(lists, fits, in_order=False)
    return _render(parts, shown)
