"""Budgets: a recall answer and a briefing fitted to their caps, and the one word-boundary cut.

Recall (REQ-12) drops items from the end of its sections in a fixed order until the document fits;
a briefing (REQ-14) places each item whole or drops it whole, section by section within its share.
`cut_at_word` is the one place text is shortened (recall's gists, the title column), always between words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from ..errors import InvalidArgument
from ._model import (
    RECALL_SECTIONS,
    Document,
    Item,
    Section,
    _check_nonce,
    _content_strings,
    _single_line,
    new_nonce,
)
from ._render import _dropped_line, _footer, _header, _heading, _item_block

#: REQ-12: a recall response is at most 16 KiB.
RECALL_MAX_BYTES = 16384
#: What a tool response adds around the document on the wire: the JSON-RPC envelope
#: (``{"jsonrpc":"2.0","id":…,"result":{"content":[{"type":"text","text":"…"}],"isError":false}}``) and
#: the server-sent-event framing of streamable HTTP. Generous on purpose: REQ-12's bound is the whole
#: response, and the document inside it is JSON-escaped.
WIRE_ENVELOPE_BYTES = 512
#: REQ-14: a briefing is at most 4096 bytes whatever briefing_max_chars says.
BRIEFING_MAX_BYTES = 4096
#: REQ-12: over the cap, items go from the end of these sections, in this order.
_RECALL_DROP_ORDER = ("episodes", "recent_runs", "facts")
#: What a text cut at a word ends with (`cut_at_word`: recall's gists). A briefing never cuts.
ELLIPSIS = "…"

#: What json.dumps(s, ensure_ascii=False) does to a str, without its per-call set-up.
_encode_json_string = json.encoder.encode_basestring

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
