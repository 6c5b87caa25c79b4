"""The Redactor: a compiled rule set applied to a text, keywords first, until nothing changes."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import accumulate
from typing import Any

import ahocorasick_rs
import attrs

from ._control import _ESCAPES, _has_control, _may_escape, _strip_control_alone, strip_control
from ._rules import REDACTED, RedactionRule, _replace_spans, load_rules

#: Counters of :meth:`Redactor.redact` calls and the characters they scanned since import: tests and
#: benchmarks read them to check that each string is redacted once (an ingest once redacted
#: the same strings several times).
STATS: dict[str, int] = {"calls": 0, "chars": 0}

# A redaction that still changes its own output after this many rounds has a broken rule set; the
# bound only guards against an endless loop if someone adds such a rule to the data file.
_MAX_ROUNDS = 8

# The two characters that ``re``'s IGNORECASE matches to an ASCII letter but ``str.lower`` leaves as
# they are (dotless i, long s; the Kelvin sign lowers to k, and İ lowers to two characters, which the
# keyword positions check): folded in the lower-cased text the keywords are looked for in, so a
# ``(?i:secret)`` rule is chosen, and tried, where the text says ``ſecret``.
_FOLD = str.maketrans({"\u0131": "i", "\u017f": "s"})


def _lower(text: str) -> str:
    """``text`` lower-cased for the keyword automaton (`_FOLD`)."""
    lowered = text.lower()
    return lowered if lowered.isascii() else lowered.translate(_FOLD)


@attrs.frozen
class Redactor:
    """Strips control characters and replaces every secret its rules find with ``[REDACTED]``.

    Keywords first, as gitleaks does: each distinct keyword is looked up once in the lower-cased text
    (a C substring search), and a rule's pattern runs only when one of its keywords occurs. Ordinary
    text runs a handful of patterns, not all of them.
    """

    rules: tuple[RedactionRule, ...] = attrs.field(factory=load_rules)
    _keywords: tuple[str, ...] = attrs.field(init=False)
    #: keyword -> positions of the rules that name it; the rules without keywords always run.
    _by_keyword: dict[str, tuple[int, ...]] = attrs.field(init=False)
    _always: frozenset[int] = attrs.field(init=False)
    #: Every keyword in one Aho-Corasick automaton: one pass over the text finds all that occur.
    _automaton: Any = attrs.field(init=False)

    @_keywords.default
    def _all_keywords(self) -> tuple[str, ...]:
        return tuple(sorted({k for rule in self.rules for k in rule.keywords}))

    @_by_keyword.default
    def _rules_by_keyword(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(i for i, rule in enumerate(self.rules) if k in rule.keywords) for k in self._keywords}

    #: keyword index -> positions of the rules that name it; rule position -> its keywords' indexes.
    _by_keyword_index: tuple[tuple[int, ...], ...] = attrs.field(init=False)
    _keyword_indexes: tuple[tuple[int, ...], ...] = attrs.field(init=False)

    @_by_keyword_index.default
    def _rules_by_keyword_index(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self._by_keyword[k] for k in self._keywords)

    @_keyword_indexes.default
    def _keywords_by_rule(self) -> tuple[tuple[int, ...], ...]:
        index = {k: n for n, k in enumerate(self._keywords)}
        return tuple(tuple(index[k] for k in rule.keywords) for rule in self.rules)

    #: rule position -> its phase.
    _phases: tuple[int, ...] = attrs.field(init=False)

    @_phases.default
    def _phase_by_rule(self) -> tuple[int, ...]:
        return tuple(rule.phase for rule in self.rules)

    @_always.default
    def _keywordless(self) -> frozenset[int]:
        return frozenset(i for i, rule in enumerate(self.rules) if not rule.keywords)

    @_automaton.default
    def _keyword_automaton(self) -> Any:
        return ahocorasick_rs.AhoCorasick(self._keywords, matchkind=ahocorasick_rs.MATCHKIND_STANDARD,
                                          implementation=ahocorasick_rs.Implementation.DFA)

    def candidates(self, text: str) -> list[RedactionRule]:
        """The rules whose keywords occur in ``text`` (case-insensitively), plus those without keywords,
        in rule order. One pass of an Aho-Corasick automaton over the lower-cased text finds every
        keyword that occurs (overlapping ones too), as gitleaks does; testing each of the ~250 keywords
        with `in` cost 40 % of an ingest's CPU. Most strings hold no keyword: they run no pattern but
        the keyword-less ones."""
        return [rule for rule, _ in self._scan(text)]

    def _scan(self, text: str) -> list[tuple[RedactionRule, list[int] | None]]:
        """`candidates`, each with where its keywords start in ``text`` (for anchored rules; None when
        lower-casing changed the text's length, so positions would not map: then the rule scans)."""
        chosen, positions = self._find(text)
        rules = self.rules
        return [(rules[i], self._starts(i, positions)) for i in chosen]

    def _find(self, text: str) -> tuple[list[int], dict[int, list[int]] | None]:
        """The candidate rules' positions in `rules` (in order), and where each keyword found starts
        (keyword index -> positions; None when lower-casing changed the text's length)."""
        if not self._keywords:
            return sorted(self._always), None
        found = self._automaton.find_matches_as_indexes(lowered := _lower(text), overlapping=True)
        if not found:
            return sorted(self._always), {}
        positions: dict[int, list[int]] = {}
        for index, start, _ in found:
            if index in positions:
                positions[index].append(start)
            else:
                positions[index] = [start]
        chosen = set(self._always)
        by_index = self._by_keyword_index
        for index in positions:
            chosen.update(by_index[index])
        return sorted(chosen), positions if len(lowered) == len(text) else None

    def _starts(self, rule: int, positions: dict[int, list[int]] | None) -> list[int] | None:
        """Where an anchored rule's keywords start, from `_find`'s ``positions``; None for a rule that
        scans (or when positions do not map)."""
        if positions is None or not self.rules[rule].anchored:
            return None
        return [p for index in self._keyword_indexes[rule] if index in positions for p in positions[index]]

    def redact(self, text: str) -> str:
        """Return ``text`` with control characters stripped and every secret replaced; idempotent."""
        STATS["calls"] += 1
        STATS["chars"] += len(text)
        return self._redact_text(text)

    def _redact_text(self, text: str) -> str:
        stripped = strip_control(text)
        out = self._redact_stripped(stripped)
        if _may_escape(text) and _ESCAPES.search(text):
            # An escape sequence goes whole, with the printable characters after its ESC: a secret with an
            # ESC inside could lose some of them and no longer look like one. Read once more with each
            # control character alone removed; if that finds more secrets, its answer is served (escape
            # remnants and all): no secret is ever kept to drop an escape sequence.
            alone = _strip_control_alone(text)
            if alone != stripped:
                other = self._redact_stripped(alone)
                if other.count(REDACTED) > out.count(REDACTED):
                    return other
        return out

    def redact_many(self, texts: Sequence[str]) -> list[str]:
        """``[self.redact(t) for t in texts]``, with one keyword pass for them all.

        Many short strings (a record's fields, an episode's rendered lines) each paid the per-call cost
        of a keyword pass. Here the stripped, lower-cased strings are joined with NUL (no keyword holds
        one, and stripping removed every NUL from the strings) and the automaton runs once: a keyword
        found lies inside one string, and a string with none runs no rule, so its answer is the stripped
        string itself — exactly `redact`'s. Only the strings holding a keyword go through `redact`'s rules.
        """
        STATS["calls"] += len(texts)
        STATS["chars"] += sum(len(t) for t in texts)
        # One scan for control characters over them all; most strings hold none.
        joined = "".join(texts)
        if _may_escape(joined) and _ESCAPES.search(joined):  # the few with one get `redact`'s second reading
            return [self._redact_text(t) for t in texts]
        stripped = [strip_control(t) for t in texts] if _has_control(joined) else list(texts)
        if self._always or not self._keywords or len(stripped) < 2:
            return [self._redact_stripped(t) for t in stripped]
        lowered = [_lower(t) for t in stripped]
        ends = list(accumulate(len(t) + 1 for t in lowered))  # each string's end (+ its NUL) in `joined`
        hit: set[int] = set()
        for _, start, _ in self._automaton.find_matches_as_indexes("\0".join(lowered), overlapping=True):
            hit.add(bisect_right(ends, start))
        return [self._redact_stripped(t) if n in hit else t for n, t in enumerate(stripped)]

    def secret_spans(self, text: str) -> list[tuple[int, int]]:
        """The spans of ``text`` (control characters already stripped) that one round of the rules
        replaces, merged; :class:`LineRedactor` maps them onto its last line."""
        spans = [span for rule, starts in self._scan(text) for span in rule.spans(text, self._redact_stripped, starts)]
        spans.sort()
        merged: list[tuple[int, int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def _redact_stripped(self, current: str) -> str:
        # Within a phase every candidate rule looks at the same text and their secret spans are replaced
        # together (a union): a rule applied first can no longer cut a longer secret another rule would
        # take whole (ours takes `glpat-…` up to a dot, gitleaks' routable rule takes the dot and on).
        phase_of, spans_of = self._phases, self._spans
        chosen, positions = self._find(current)
        for _ in range(_MAX_ROUNDS):
            result = current
            # Phases 1 (shapes) and 2 (contexts) each as a union; phase 3 (the wide generic key = value
            # rules) rule by rule, so a generic rule never widens a span a precise one has replaced.
            # Keyword positions are found again whenever a replacement has moved them (and the last
            # finding is the next round's: it is of the text that round starts with).
            for phase in (1, 2):
                spans = [span for i in chosen if phase_of[i] == phase for span in spans_of(i, result, positions)]
                if spans:
                    result = _replace_spans(result, spans)
                    chosen, positions = self._find(result)
            for i in [i for i in chosen if phase_of[i] == 3]:
                # A rule whose keywords a replacement removed still runs (scanning: no positions).
                spans = list(spans_of(i, result, positions if i in chosen else None))
                if spans:
                    result = _replace_spans(result, spans)
                    chosen, positions = self._find(result)
            if result == current:
                return result
            current = result
        return current

    def _spans(self, rule: int, text: str, positions: dict[int, list[int]] | None) -> Iterator[tuple[int, int]]:
        return self.rules[rule].spans(text, self._redact_stripped, self._starts(rule, positions))

    def redact_obj(self, value: Any) -> Any:
        """Redact every string inside nested dicts, lists and tuples; dict keys and non-strings are kept.

        Used on whole episodes: keys are our own field names, values may carry agent text.
        """
        return _walk(value, self.redact)


def _walk(value: Any, fn: Callable[[str], str]) -> Any:
    match value:
        case str():
            return fn(value)
        case Mapping():
            return {k: _walk(v, fn) for k, v in value.items()}
        case list():
            return [_walk(v, fn) for v in value]
        case tuple():
            return tuple(_walk(v, fn) for v in value)
        case _:
            return value

