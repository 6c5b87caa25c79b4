"""A served document's parts, and the nonce that makes its fences unforgeable.

A document is a fixed sequence of sections. Each item carries a provenance line built only from the
daemon's own rows, and its text inside a fence that closes only with the document's nonce, so text an
agent or a provider wrote (flagged ``untrusted``) can neither forge a provenance line nor end its fence
early. The nonce is fresh per document, has 64 random bits, and is regenerated until it occurs nowhere in
the document's content.
"""

from __future__ import annotations

import re
import secrets
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import attrs

from ..errors import InvalidArgument, MemactorsError

#: Random bytes per nonce. Fixed, so a nonce is always 16 hex digits and rendered sizes are stable.
NONCE_BYTES = 8
#: REQ-12's sections, in order.
RECALL_SECTIONS = ("facts", "episodes", "recent_runs")
#: REQ-14's sections, in order.
BRIEFING_SECTIONS = ("collisions", "recent_runs", "facts", "episodes")
#: Separator between provenance fields on one line.
_SEP = " · "

Label = Literal["fact", "episode", "run", "collision"]
Kind = Literal["recall", "briefing"]

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


def _items(items: Iterable[Item]) -> tuple[Item, ...]:
    """A section's items as a tuple (a typed ``tuple``: the checker cannot infer a bare one's type)."""
    return tuple(items)


@attrs.frozen
class Section:
    """A named section: its items in order, how many were left out, and an optional note shown in the
    heading (e.g. ``provider_unavailable`` on a degraded episodes section)."""

    name: str = attrs.field(converter=_key)
    items: tuple[Item, ...] = attrs.field(converter=_items)
    dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    note: str | None = attrs.field(default=None, converter=attrs.converters.optional(_single_line))


def _sections(sections: Iterable[Section]) -> tuple[Section, ...]:
    """A document's sections as a tuple (typed, as `_items`)."""
    return tuple(sections)


@attrs.frozen
class Document:
    """A whole recall response or briefing.

    ``truncated`` counts the items the size cap removed; ``pointer`` is the hint appended to each
    section's "more not shown" line (briefings point to the recall tool).
    """

    kind: Kind = attrs.field(validator=attrs.validators.in_(("recall", "briefing")))
    sections: tuple[Section, ...] = attrs.field(converter=_sections)
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
