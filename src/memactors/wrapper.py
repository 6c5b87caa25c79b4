"""The memory data wrapper: the one document format recall and briefings serve to agents.

A document is a fixed sequence of sections. Each item carries a provenance line built only from the
daemon's own rows, and its text inside a fence that closes only with the document's nonce, so text an
agent or a provider wrote (flagged ``untrusted``) can neither forge a provenance line nor end its fence
early. The nonce is fresh per document, has 64 random bits, and is regenerated until it occurs nowhere in
the document's content.

This module is pure code: it builds, renders and budgets documents. Recall (REQ-12) and briefings
(REQ-14) gather the rows and call :func:`fit_recall` / :func:`fit_briefing`; the gateway serves
:func:`render_text` as text and :func:`render_json` as MCP structured content. The format is described
for agent and provider authors in ``docs/wrapper.md``.
"""

from __future__ import annotations

import json
import re
import secrets
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import attrs

from .errors import InvalidArgument, MemactorsError

__all__ = [
    "NONCE_BYTES",
    "RECALL_MAX_BYTES",
    "BRIEFING_MAX_BYTES",
    "RECALL_SECTIONS",
    "BRIEFING_SECTIONS",
    "Provenance",
    "Item",
    "Section",
    "Document",
    "build_document",
    "new_nonce",
    "render_text",
    "render_json",
    "fit_recall",
    "fit_briefing",
    "cut_at_word",
    "ELLIPSIS",
]

#: Random bytes per nonce. Fixed, so a nonce is always 16 hex digits and rendered sizes are stable.
NONCE_BYTES = 8
#: REQ-12: a recall response is at most 16 KiB.
RECALL_MAX_BYTES = 16384
#: What a tool response adds around the document on the wire: the JSON-RPC envelope
#: (``{"jsonrpc":"2.0","id":…,"result":{"content":[{"type":"text","text":"…"}],"isError":false}}``) and
#: the server-sent-event framing of streamable HTTP. Generous on purpose: REQ-12's bound is the whole
#: response, and the document inside it is JSON-escaped.
WIRE_ENVELOPE_BYTES = 512
#: REQ-14: a briefing is at most 4096 bytes whatever briefing_max_chars says.
BRIEFING_MAX_BYTES = 4096
#: REQ-12's sections, in order.
RECALL_SECTIONS = ("facts", "episodes", "recent_runs")
#: REQ-14's sections, in order.
BRIEFING_SECTIONS = ("collisions", "recent_runs", "facts", "episodes")
#: REQ-12: over the cap, items go from the end of these sections, in this order.
_RECALL_DROP_ORDER = ("episodes", "recent_runs", "facts")
#: Separator between provenance fields on one line.
_SEP = " · "
#: The opening lines of an item's fence (see _item_block: the closing line carries the nonce).
_OPEN = "<item>"
_OPEN_UNTRUSTED = '<item untrusted="true">'
#: What a text cut at a word ends with (`cut_at_word`: recall's gists). A briefing never cuts.
ELLIPSIS = "…"

Label = Literal["fact", "episode", "run", "collision"]
Kind = Literal["recall", "briefing"]

#: What json.dumps(s, ensure_ascii=False) does to a str, without its per-call set-up.
_encode_json_string = json.encoder.encode_basestring
_NONCE_RE = re.compile(r"^[0-9A-Za-z_-]{16,64}$")
_MAX_NONCE_ATTEMPTS = 64


def _single_line(value: object) -> str:
    """Make a provenance value safe for one line: no control, format or line-separator characters,
    whitespace runs collapsed, and no field separator, so nothing can forge a line or a field."""
    text = value if type(value) is str else str(value)
    # Printable ASCII has one whitespace character, the space: no run of two and none at either end
    # means the text is already one safe line (the common case, no per-character scan, no copy).
    if text.isascii() and text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    out: list[str] = []
    for ch in text:
        if ch == "·":
            out.append(".")
        elif ch.isspace() or unicodedata.category(ch)[0] in ("C", "Z"):
            out.append(" ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def _key(value: object) -> str:
    """A provenance key: one token, no spaces."""
    return _single_line(value).replace(" ", "_")


#: Cleaned provenance keys by the key as given: the keys are a small fixed set (the daemon's own
#: column names), cleaned once each instead of once per item of every document.
_KEYS: dict[str, str] = {}


def _clean_fields(fields: Iterable[tuple[object, object]]) -> tuple[tuple[str, str], ...]:
    """Convert provenance pairs to single-line strings; pairs whose value is empty are omitted."""
    cleaned: list[tuple[str, str]] = []
    for key, value in fields:
        if value is None:
            continue
        k = _KEYS.get(key) if type(key) is str else None
        if k is None:
            k = _key(key)
            if type(key) is str and len(_KEYS) < 1024:
                _KEYS[key] = k
        v = _single_line(value)
        if not k:
            raise InvalidArgument("provenance key is empty", field="provenance")
        if v:
            cleaned.append((k, v))
    return tuple(cleaned)


def _unique_keys(_inst: Any, _attr: Any, fields: tuple[tuple[str, str], ...]) -> None:
    if len({k for k, _ in fields}) == len(fields):
        return
    keys = [k for k, _ in fields]
    if len(keys) != len(set(keys)):
        raise InvalidArgument("provenance keys must be unique", field="provenance", keys=",".join(keys))


@attrs.frozen
class Provenance:
    """Where an item came from: a label and ordered key/value pairs taken only from the daemon's rows.

    Values are forced onto one line when the object is built (see :func:`_single_line`); pairs with an
    empty or ``None`` value are left out. For an episode, e.g. ``provider, episode, run, harness,
    adapter, model, repo, branch, outcome, at``; for a fact ``fact, scope, confidence, status,
    updated``; for a run ``run, harness, adapter, outcome, ended, duration_ms, pull_request``; for a
    collision ``harness, run, branch, paths``.
    """

    label: Label = attrs.field(validator=attrs.validators.in_(("fact", "episode", "run", "collision")))
    fields: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_clean_fields, validator=_unique_keys
    )

    def line(self) -> str:
        """The provenance line: ``- <label> <first value> · key value · ...``.

        When the first key equals the label (``fact f_812``) the label is not repeated.
        """
        parts = [f"{k} {v}" for k, v in self.fields]
        if not self.fields or self.fields[0][0] != self.label:
            parts.insert(0, self.label)
        return "- " + _SEP.join(parts)


@attrs.frozen
class Item:
    """One served item: provenance from the daemon, text (possibly empty) and the untrusted flag.

    ``untrusted`` marks agent-written text (REQ-6): episode result excerpts and summaries and every
    provider text. An episode item is therefore always untrusted; building one otherwise is a bug.
    """

    provenance: Provenance
    text: str
    untrusted: bool

    def __attrs_post_init__(self) -> None:
        if self.provenance.label == "episode" and not self.untrusted:
            raise InvalidArgument("episode text is agent-written and must be flagged untrusted")


@attrs.frozen
class Section:
    """A named section: its items in order, how many were left out, and an optional note shown in the
    heading (e.g. ``provider_unavailable`` on a degraded episodes section)."""

    name: str = attrs.field(converter=_key)
    items: tuple[Item, ...] = attrs.field(converter=tuple)
    dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    note: str | None = attrs.field(default=None, converter=attrs.converters.optional(_single_line))


@attrs.frozen
class Document:
    """A whole recall response or briefing.

    ``truncated`` counts the items the size cap removed; ``pointer`` is the hint appended to each
    section's "more not shown" line (briefings point to the recall tool).
    """

    kind: Kind = attrs.field(validator=attrs.validators.in_(("recall", "briefing")))
    sections: tuple[Section, ...] = attrs.field(converter=tuple)
    nonce: str
    degraded: str | None = attrs.field(default=None, converter=attrs.converters.optional(_single_line))
    truncated: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    pointer: str | None = attrs.field(default=None, converter=attrs.converters.optional(_single_line))

    @property
    def is_empty(self) -> bool:
        """True when no section has an item or a left-out count (REQ-14's empty briefing)."""
        return all(not s.items and not s.dropped for s in self.sections)


# --- nonce ------------------------------------------------------------------------------------------


def _content_strings(sections: Iterable[Section], *extra: str | None) -> Iterator[str]:
    """Every string a rendered document carries besides its own markup."""
    for s in sections:
        yield s.name
        if s.note:
            yield s.note
        for it in s.items:
            yield it.text
            yield it.provenance.label
            for k, v in it.provenance.fields:
                yield k
                yield v
    for e in extra:
        if e:
            yield e


def new_nonce(texts: Iterable[str]) -> str:
    """A fresh nonce (``NONCE_BYTES`` random bytes from :mod:`secrets`, as hex) found in none of
    ``texts``; regenerated until so. The nonce is what makes a fence unforgeable: text that does not
    contain it cannot close its fence."""
    pool = _joined(texts)
    for _ in range(_MAX_NONCE_ATTEMPTS):
        nonce = secrets.token_hex(NONCE_BYTES)
        if nonce not in pool:
            return nonce
    raise MemactorsError("no fresh nonce after repeated attempts; the random source is broken")


def _joined(strings: Iterable[str]) -> str:
    """The strings joined by NUL, for one substring search instead of one per string: a nonce has no
    NUL ([0-9A-Za-z_-] only), so it occurs in the joined text exactly when it occurs in one of them."""
    return "\0".join(strings)


def _check_nonce(nonce: str, strings: Iterable[str]) -> None:
    if not _NONCE_RE.match(nonce):
        raise InvalidArgument("nonce must be 16 to 64 characters of [0-9A-Za-z_-]", field="nonce")
    if nonce in _joined(strings):
        raise InvalidArgument("nonce occurs in the document's content", field="nonce")


def build_document(
    kind: Kind,
    sections: Sequence[Section],
    *,
    degraded: str | None = None,
    truncated: int = 0,
    pointer: str | None = None,
    nonce: str | None = None,
) -> Document:
    """A document over ``sections`` as given (no budgeting), with a fresh nonce unless one is passed.

    A passed nonce is checked: it must not occur in any of the content. Raises InvalidArgument.
    """
    sections = tuple(sections)
    strings = list(_content_strings(sections, degraded, pointer))
    if nonce is None:
        nonce = new_nonce(strings)
    else:
        _check_nonce(nonce, strings)
    return Document(kind, sections, nonce, degraded, truncated, pointer)


# --- rendering ---------------------------------------------------------------------------------------
# The text form is blocks joined by "\n" with no trailing newline. The budgeting code measures the
# same blocks these helpers build, so what it counts is exactly what render_text emits.


def _header(kind: str, nonce: str, degraded: str | None, truncated: int) -> str:
    deg = f' degraded="{degraded}"' if degraded else ""
    return f'<memory-data kind="{kind}" nonce="{nonce}"{deg} truncated="{truncated}">'


def _footer(nonce: str) -> str:
    return f'</memory-data nonce="{nonce}">'


def _heading(section: Section) -> str:
    return f"## {section.name}" + (f" ({section.note})" if section.note else "")


def _dropped_line(count: int, pointer: str | None) -> str:
    return f"({count} more not shown; {pointer})" if pointer else f"({count} more not shown)"


def _item_block(item: Item, nonce: str) -> str:
    """An item: its provenance line, then (when it has text) the text fenced.

    The opening line carries no nonce, only the flag: it always follows the item's provenance line,
    which is outside every fence, so no text can put an opening line anywhere a reader would take one.
    The closing line carries the nonce, and that is what text cannot forge: nothing ends a fence but
    ``</item nonce="N">``. Leaving the nonce off the opening line saves 24 characters per item, which
    a briefing spends on the items' own text.
    """
    line = item.provenance.line()
    if not item.text:
        return line
    opening = _OPEN_UNTRUSTED if item.untrusted else _OPEN
    return f'{line}\n{opening}\n{item.text}\n</item nonce="{nonce}">'


def item_chars(item: Item) -> int:
    """Characters `item` takes in a document (its block and the line break after it), with a nonce of
    the length every document's has (``NONCE_BYTES`` as hex): what it costs of a section's share."""
    return len(_item_block(item, "0" * (2 * NONCE_BYTES))) + 1


def _blocks(doc: Document) -> list[str]:
    blocks = [_header(doc.kind, doc.nonce, doc.degraded, doc.truncated)]
    for s in doc.sections:
        blocks.append(_heading(s))
        blocks.extend(_item_block(it, doc.nonce) for it in s.items)
        if s.dropped:
            blocks.append(_dropped_line(s.dropped, doc.pointer))
    blocks.append(_footer(doc.nonce))
    return blocks


def render_text(doc: Document, *, show_degraded: bool = False) -> str:
    """The plain-text document; deterministic for a given document (nonce included).

    An empty briefing renders as ``""`` (REQ-14), unless ``show_degraded`` and it is degraded: then it
    renders its headings and marker as a recall does (a briefing read while the store is down is not
    known to be empty; the gateway tells the agent so, REQ-13). An empty recall still renders its
    headings, so the agent sees the sections and any ``degraded`` marker. Raises InvalidArgument if the
    nonce occurs in the content (a hand-built document with a bad nonce).
    """
    if doc.kind == "briefing" and doc.is_empty and not (show_degraded and doc.degraded):
        return ""
    _check_nonce(doc.nonce, _content_strings(doc.sections, doc.degraded, doc.pointer))
    return "\n".join(_blocks(doc))


def render_json(doc: Document) -> dict[str, Any]:
    """The same content as JSON-ready data (MCP structured content)."""
    return {
        "kind": doc.kind,
        "nonce": doc.nonce,
        "degraded": doc.degraded,
        "truncated": doc.truncated,
        "pointer": doc.pointer,
        "sections": [
            {
                "name": s.name,
                "note": s.note,
                "dropped": s.dropped,
                "items": [
                    {
                        "label": it.provenance.label,
                        "provenance": dict(it.provenance.fields),
                        "text": it.text,
                        "untrusted": it.untrusted,
                    }
                    for it in s.items
                ],
            }
            for s in doc.sections
        ],
    }


# --- budgeting ---------------------------------------------------------------------------------------


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _wire_nbytes(s: str) -> int:
    """Bytes `s` takes inside a JSON string on the wire (quotes, backslashes, LF and controls escaped)."""
    return len(_encode_json_string(s).encode("utf-8", "surrogatepass")) - 2


def fit_recall(
    sections: Sequence[Section],
    max_bytes: int = RECALL_MAX_BYTES,
    *,
    degraded: str | None = None,
    nonce: str | None = None,
    wire: bool = False,
) -> Document:
    """REQ-12's recall document: ``facts``, ``episodes``, ``recent_runs`` in that order, never
    interleaved or re-scored, at most ``max_bytes`` UTF-8 bytes of :func:`render_text` output.

    Over the cap, items go from the end of episodes, then recent_runs, then facts; ``truncated`` is
    the number removed, and each section's ``dropped`` grows by its share of them. The text form is
    the measure (the JSON form escapes quotes and control characters and can be slightly larger).
    Each item's size is computed once, so this is linear in the input. Raises InvalidArgument when
    the sections are not REQ-12's or even the empty document exceeds the cap.

    With ``wire``, the measure is the whole tool response as the gateway sends it: the text JSON-escaped
    (every LF two bytes, quotes and controls escaped) plus WIRE_ENVELOPE_BYTES, within ``max_bytes``.
    """
    size = _wire_nbytes if wire else _nbytes
    joint = 2 if wire else 1  # the "\n" between blocks, escaped on the wire
    if wire:
        max_bytes -= WIRE_ENVELOPE_BYTES
    names = tuple(s.name for s in sections)
    if names != RECALL_SECTIONS:
        raise InvalidArgument(
            "recall sections must be facts, episodes, recent_runs", sections=",".join(names)
        )
    sections = tuple(sections)
    strings = list(_content_strings(sections, degraded))
    if nonce is None:
        nonce = new_nonce(strings)
    else:
        _check_nonce(nonce, strings)

    # Every block costs its bytes plus one for the "\n" joining it to the next; the last has none.
    costs = {s.name: [size(_item_block(it, nonce)) + joint for it in s.items] for s in sections}
    kept = {s.name: len(s.items) for s in sections}
    base_dropped = {s.name: s.dropped for s in sections}
    removed = dict.fromkeys(kept, 0)
    fixed = sum(size(_heading(s)) + joint for s in sections) + size(_footer(nonce))
    items_total = sum(sum(c) for c in costs.values())

    def total() -> int:
        truncated = sum(removed.values())
        n = fixed + items_total + size(_header("recall", nonce, degraded, truncated)) + joint
        for name in kept:
            dropped = base_dropped[name] + removed[name]
            if dropped:
                n += size(_dropped_line(dropped, None)) + joint
        return n

    if total() <= max_bytes:  # the common case: everything fits, the sections stand as given
        return Document("recall", sections, nonce, degraded, 0)
    for name in _RECALL_DROP_ORDER:
        while kept[name] and total() > max_bytes:
            kept[name] -= 1
            items_total -= costs[name][kept[name]]
            removed[name] += 1
    if total() > max_bytes:
        raise InvalidArgument("max_bytes is smaller than an empty recall document", max_bytes=max_bytes)

    fitted = tuple(
        attrs.evolve(s, items=s.items[: kept[s.name]], dropped=s.dropped + removed[s.name]) for s in sections
    )
    return Document("recall", fitted, nonce, degraded, sum(removed.values()))


def cut_at_word(text: str, max_chars: int, max_bytes: int | None = None) -> str:
    """``text`` if it fits in ``max_chars`` characters and ``max_bytes`` UTF-8 bytes; else its longest
    prefix that ends at a word boundary and, with ``…`` appended, fits; ``""`` when not even its first
    word does.

    A word is a run of letters and digits, as REQ-9's text check (`actors.index.text_belongs`) and
    FTS5's unicode61 tokenizer see words, so a cut never splits one: every word the result holds is a
    whole word of ``text``, and a text that passed the check still passes it. The cut falls before a
    space when there is one in the last 40 % of the room, else at the last place between a word and a
    non-word character (inside a long path, after a ``/``).
    """
    if max_bytes is None:
        max_bytes = 4 * max_chars
    if len(text) <= max_chars and _nbytes(text) <= max_bytes:
        return text
    limit = max_chars - len(ELLIPSIS)
    budget = max_bytes - _nbytes(ELLIPSIS)
    if limit <= 0 or budget <= 0:
        return ""
    end = min(limit, len(text))
    if _nbytes(text[:end]) > budget:  # wide characters: the longest prefix within the bytes
        lo, hi = 0, end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _nbytes(text[:mid]) <= budget else (lo, mid - 1)
        end = lo
    # end < len(text) here (text did not fit), so text[end] exists: is the cut at a space?
    cut = next((i for i in range(end, 0, -1) if text[i].isspace()), 0)
    if cut < end * 0.6:
        cut = max(cut, next((i for i in range(end, 0, -1)
                             if not (text[i - 1].isalnum() and text[i].isalnum())), 0))
    head = text[:cut].rstrip()
    return head + ELLIPSIS if head else ""


def fit_briefing(
    sections: Sequence[tuple[Section, int, float]],
    *,
    max_chars: int,
    max_bytes: int = BRIEFING_MAX_BYTES,
    recall_pointer: str = "use the recall tool for more",
    degraded: str | None = None,
    nonce: str | None = None,
) -> Document:
    """REQ-14's briefing document from ``(section, max_items, share)`` triples, filled in order.

    The rendered text is at most ``max_chars`` characters and ``max_bytes`` UTF-8 bytes, fixed
    overhead (header, headings, footer) included. Within a section, the first ``max_items`` items are
    considered in order; one whose rendered size exceeds what is left of the section's share
    (``share * max_chars`` characters) or of the whole cap is dropped whole, never cut, and later,
    smaller items may still fit. Items beyond ``max_items`` count as dropped. A section that dropped
    anything ends with ``(N more not shown; <recall_pointer>)``; room for that line is reserved for
    every later non-empty section so earlier sections can never starve it. ``truncated`` is the total
    dropped. Same inputs and same nonce give byte-identical output. Raises InvalidArgument when the
    cap cannot hold the document's fixed overhead.

    Every item is placed whole or dropped whole, whatever its section and whoever wrote its text: an
    episode item is never shortened to fit (not to a subset of its sentences, not to the first lines of
    a provider's long text). A provider whose texts are too long for a briefing's share shows no
    episode there, only the count and the pointer to recall (docs/write-a-provider.md, "What fits a
    briefing").
    """
    secs = tuple(s for s, _, _ in sections)
    strings = list(_content_strings(secs, degraded, recall_pointer))
    if nonce is None:
        nonce = new_nonce(strings)
    else:
        _check_nonce(nonce, strings)
    pointer = _single_line(recall_pointer)
    n_total = sum(len(s.items) + s.dropped for s in secs)

    def worst_dropped(s: Section) -> tuple[int, int]:
        # The widest "more not shown" line this section could need: its count cannot exceed this.
        line = _dropped_line(len(s.items) + s.dropped, pointer)
        return len(line) + 1, _nbytes(line) + 1

    # Header reserved at its widest truncated count, so the header never outgrows its reservation.
    header = _header("briefing", nonce, degraded, n_total)
    used_c = len(header) + 1 + len(_footer(nonce))
    used_b = _nbytes(header) + 1 + _nbytes(_footer(nonce))
    for s in secs:
        h = _heading(s)
        used_c += len(h) + 1
        used_b += _nbytes(h) + 1
    # Reservation for the worst-case dropped line of every section not yet filled.
    reserve = [worst_dropped(s) if (s.items or s.dropped) else (0, 0) for s in secs]
    res_c = sum(r[0] for r in reserve)
    res_b = sum(r[1] for r in reserve)
    # Invariant from here on: used + reservations of unfilled sections <= cap.
    if used_c + res_c > max_chars or used_b + res_b > max_bytes:
        raise InvalidArgument(
            "briefing cap is smaller than the document's fixed overhead",
            max_chars=max_chars,
            max_bytes=max_bytes,
        )

    fitted: list[Section] = []
    truncated = 0
    for (section, max_items, share), (r_c, r_b) in zip(sections, reserve, strict=True):
        res_c -= r_c
        res_b -= r_b
        room_c = max_chars - used_c - res_c
        room_b = max_bytes - used_b - res_b
        share_c = int(share * max_chars)
        items, dropped, sec_c, sec_b = _fill_section(section, max_items, share_c, room_c, room_b, nonce, pointer)
        used_c += sec_c
        used_b += sec_b
        truncated += dropped - section.dropped
        fitted.append(attrs.evolve(section, items=items, dropped=dropped))
    return Document("briefing", tuple(fitted), nonce, degraded, truncated, pointer)


def _fill_section(section: Section, max_items: int, share_c: int, room_c: int, room_b: int, nonce: str,
                  pointer: str) -> tuple[tuple[Item, ...], int, int, int]:
    """A section's items that fit whole, in order: (items, dropped, characters, bytes used)."""
    kept: list[tuple[Item, int, int]] = []
    sec_c = sec_b = 0
    for it in section.items[: max(max_items, 0)]:
        block = _item_block(it, nonce)
        c, b = len(block) + 1, _nbytes(block) + 1
        if sec_c + c <= share_c and sec_c + c <= room_c and sec_b + b <= room_b:
            kept.append((it, c, b))
            sec_c += c
            sec_b += b
    dropped = section.dropped + len(section.items) - len(kept)
    if dropped:
        # The dropped line must fit too; give up last kept items until it does.
        while True:
            line = _dropped_line(dropped, pointer)
            if sec_c + len(line) + 1 <= room_c and sec_b + _nbytes(line) + 1 <= room_b:
                break
            _, c, b = kept.pop()  # never empty: the reserved worst-case line fits an empty section
            sec_c -= c
            sec_b -= b
            dropped += 1
        sec_c += len(line) + 1
        sec_b += _nbytes(line) + 1
    return tuple(it for it, _, _ in kept), dropped, sec_c, sec_b
