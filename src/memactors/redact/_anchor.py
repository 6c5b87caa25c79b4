"""Anchor analysis: where, relative to one of its keywords, every match of a rule's pattern begins.

A rule whose matches all begin at a keyword (or a fixed distance from one) is tried only there
(`RedactionRule.anchored`) instead of at every character. Finding that out means reading the
pattern's parse tree, and Python exposes it only through CPython's **private** ``re._parser`` and
``re._constants`` modules (no public API, no stability promise across CPython versions). This module
is the only one that imports them. If a CPython release changes them, the analysis answers "not
anchored" for what it cannot read (`_NotAtKeyword`, ``re.error``), so rules scan as before: slower,
never different matches; tests/redact/test_redact_anchoring.py checks both the analysis and that.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any

# CPython's private modules, looked up by name: the type stubs do not describe them, so every name read
# from them is Any to the checker (as it is, in truth: CPython promises nothing about them).
_sre = importlib.import_module("re._constants")
_sre_parse = importlib.import_module("re._parser")

__all__ = ["anchor_leads"]

_ZERO_WIDTH = frozenset({_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT})
_REPEATS = frozenset({_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT})
#: A match's literal beginning is followed this far for a keyword (and no further)...
_HEAD_LIMIT = 48
#: ... along at most this many ways (alternatives multiply): past either, the rule scans.
_HEAD_WAYS = 256


class _NotAtKeyword(Exception):
    """A way for a pattern to begin that holds none of its keywords at a fixed place."""


def _heads(items: Any, pending: frozenset[str], words: tuple[str, ...], leads: set[int]) -> frozenset[str]:
    """The heads still pending after the parsed pattern ``items``, from the ``pending`` ones.

    A head is the lower-cased literal text a match has begun with, followed until a keyword ends in
    it: then where that keyword starts in the head goes into ``leads`` and the head is settled
    (dropped). Anything but a literal (a class, any character) while a head is pending, a head longer
    than `_HEAD_LIMIT` or more than `_HEAD_WAYS` of them raise `_NotAtKeyword`."""
    for op, av in items:
        if not pending:
            break
        if op in _ZERO_WIDTH:  # \b, ^, lookarounds: they consume nothing
            continue
        if op is _sre.LITERAL or (op is _sre.IN and av and all(o is _sre.LITERAL for o, _ in av)):
            out: set[str] = set()
            for head in pending:
                for code in ([av] if op is _sre.LITERAL else [c for _, c in av]):
                    grown = head + chr(code).lower()
                    word = next((k for k in words if grown.endswith(k)), None)
                    if word is not None:
                        leads.add(len(grown) - len(word))
                    elif len(grown) >= _HEAD_LIMIT:
                        raise _NotAtKeyword
                    else:
                        out.add(grown)
            pending = frozenset(out)
        elif op is _sre.SUBPATTERN:
            pending = _heads(av[3], pending, words, leads)
        elif op is _sre.ATOMIC_GROUP:
            pending = _heads(av, pending, words, leads)
        elif op is _sre.BRANCH:
            pending = frozenset().union(*(_heads(branch, pending, words, leads) for branch in av[1]))
        elif op in _REPEATS:
            low, high, sub = av
            once = _heads(sub, pending, words, leads)
            if once and high != 1:  # heads that a further repetition would go on: not followed
                raise _NotAtKeyword
            pending = pending | once if low == 0 else once
        else:  # a class, any character, a back reference
            raise _NotAtKeyword
        if len(pending) > _HEAD_WAYS:
            raise _NotAtKeyword
    return pending


def anchor_leads(pattern: re.Pattern[str], keywords: Iterable[str]) -> tuple[int, ...] | None:
    """Where, relative to one of ``keywords`` in the lower-cased text, every match of ``pattern``
    begins — each way the pattern can start (past its zero-width assertions) is literal text holding a
    keyword at a fixed place (``lead`` characters from the match's start; a leading literal lookbehind
    counts as text before the match, so its lead is negative) — or None when some way is not.

    Such a rule is tried only at those places (`RedactionRule.anchored`): the same matches as a scan,
    which can find none elsewhere, instead of a try at every character. ``re`` skips ahead quickly
    only to a case-sensitive literal prefix, which a ``(?i:…)`` alternation, a leading ``\\b`` or a
    lookbehind is not."""
    words = tuple(sorted({k.lower() for k in keywords}, key=len, reverse=True))
    if not words:
        return None
    try:
        items = list(_sre_parse.parse(pattern.pattern, pattern.flags).data)
        behind = 0
        if items and items[0][0] is _sre.ASSERT and items[0][1][0] == -1 \
                and all(op is _sre.LITERAL for op, _ in items[0][1][1]):
            behind = len(items[0][1][1])  # (?<=://)…: the literal before the match is a head too
            items = list(items[0][1][1]) + items[1:]
        leads: set[int] = set()
        if _heads(items, frozenset({""}), words, leads):
            return None  # a match can end before any keyword
    except (_NotAtKeyword, re.error, RecursionError):
        return None
    return tuple(sorted(lead - behind for lead in leads))

