"""The shared redactor: every string of an episode passes here before it is stored, summarised or sent.

SPEC-0030 REQ-6 requires one redactor (ADR-0033's) with control characters stripped. The patterns are
data, not code: ``memactors/data/redaction_rules.toml``, derived from gitleaks' MIT-licensed default rule
set (see ``memactors/data/README.md``). They are compiled once, on first use, into the module-level
:data:`default` instance that :func:`redact` and :func:`redact_obj` use.

Three properties the rest of the daemon relies on:

* Only the secret part is replaced by the literal ``[REDACTED]``; the words around it stay, so an
  episode keeps its meaning ("pushed with token [REDACTED]").
* Idempotence: ``redact(redact(x)) == redact(x)``. ``[REDACTED]`` matches no rule, and because a
  replacement can in principle open a word boundary that was not there before (``ghp_…AKIA…``), the
  rules are re-applied until nothing changes. Each extra round runs only when the previous one replaced
  something, and each replacement removes characters that are not part of a marker, so the loop ends;
  ordinary text costs exactly one round.
* Linear time: the hand-written patterns start at a literal or a rare character and use possessive
  quantifiers (a failed candidate run is consumed, via a ``reject`` group, rather than rescanned); the
  gitleaks-derived ones are bounded repetitions (their lazy prefixes dropped, ``.*`` bounded when they
  were translated), and each rule makes one ``re.sub`` pass over the text per round.
  tests/test_redact.py times adversarial inputs.
* Keywords first, as gitleaks does: a rule runs only on text holding one of its keywords, so ordinary
  text costs a handful of patterns, not ~230.
"""

from __future__ import annotations

import collections
import math
import re
import tomllib
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from itertools import accumulate
from re import _constants as _sre
from re import _parser as _sre_parse
from typing import Any

import ahocorasick_rs
import attrs

from .redact_detectors import DETECTORS, base64_fragments

__all__ = [
    "REDACTED",
    "STATS",
    "LineRedactor",
    "RedactionRule",
    "Redactor",
    "RulesError",
    "default",  # noqa: F822 - provided lazily by the module __getattr__
    "load_rules",
    "redact",
    "redact_many",
    "redact_obj",
    "redact_tail",
    "rule_ids",
    "shared",
    "shannon_entropy",
    "strip_control",
]

#: The literal that replaces every secret.
REDACTED = "[REDACTED]"


class RulesError(ValueError):
    """Raised when a redaction rule file is malformed (the packaged one never is: tests/test_redact.py
    loads it); names the file and the rule's key.

    Not a ``ConfigError``: this module imports nothing of memactors, because ``errors.ConfigError`` masks
    the values it carries through ``urls``, and ``urls`` masks a URL's path with this redactor.
    """

    def __init__(self, message: str, *, file: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.key = key

#: Counters of :meth:`Redactor.redact` calls and the characters they scanned since import: tests and
#: benchmarks read them to check that each string is redacted once (issue 11's ingest profile).
STATS: dict[str, int] = {"calls": 0, "chars": 0}

# C0 controls except \t (0x09) and \n (0x0a), DEL, C1 controls, and lone surrogates (half of a UTF-16
# pair, which no UTF-8 encoder, SQLite or the keyword automaton accepts: a str holding one can come
# from JSON's "\ud800" escape).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]+")

# A redaction that still changes its own output after this many rounds has a broken rule set; the
# bound only guards against an endless loop if someone adds such a rule to the data file.
_MAX_ROUNDS = 8


# Terminal escape sequences (ECMA-48), removed whole before the control characters (issue 25: the ESC
# alone went and `\x1b[31mred` left `[31mred`): control strings (OSC, DCS, SOS, PM, APC) up to their
# terminator (BEL or ST), CSI (parameters, intermediates, final byte), and every other escape sequence
# (ESC, intermediates, final byte: `ESC ( B`, `ESC 7`, `ESC c`); 7-bit and 8-bit introducers alike. A
# control string without its terminator is not one: only its introducer goes.
_ESCAPES = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x00-\x1f\x7f-\x9f]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
)
_ESCAPE_OR_CR = re.compile(r"[\x1b\r\x90-\x9f]")
# A carriage return (alone or before LF) is a line break: it becomes LF (issue 25: it was removed, and
# `line\rthird` became `linethird`).
_CR = re.compile(r"\r\n?")


# The two characters that ``re``'s IGNORECASE matches to an ASCII letter but ``str.lower`` leaves as
# they are (dotless i, long s; the Kelvin sign lowers to k, and İ lowers to two characters, which the
# keyword positions check): folded in the lower-cased text the keywords are looked for in, so a
# ``(?i:secret)`` rule is chosen, and tried, where the text says ``ſecret``.
_FOLD = str.maketrans({"\u0131": "i", "\u017f": "s"})


def _lower(text: str) -> str:
    """``text`` lower-cased for the keyword automaton (`_FOLD`)."""
    lowered = text.lower()
    return lowered if lowered.isascii() else lowered.translate(_FOLD)


#: The ASCII characters `strip_control` keeps: tab, newline and the printable ones.
_ASCII_KEPT = bytes([9, 10, *range(0x20, 0x7F)])
_C1_OR_ESC = re.compile(r"[\x1b\x90-\x9f]")


def _has_control(text: str) -> bool:
    """Whether `strip_control` would change ``text``. An ASCII text (most are) is checked as bytes:
    ``re``'s class search costs ~30 ns a character, deleting the kept bytes ~1."""
    if text.isascii():
        return bool(text.encode("ascii").translate(None, _ASCII_KEPT))
    return _CONTROL.search(text) is not None


def _may_escape(text: str) -> bool:
    """Whether ``text`` holds an escape sequence's introducer (ESC, or a C1 one): `_ESCAPES` can match
    only then."""
    return "\x1b" in text or (not text.isascii() and _C1_OR_ESC.search(text) is not None)


def strip_control(text: str) -> str:
    """Remove terminal escape sequences whole, make each CR (and CRLF) one LF, then remove C0 control
    characters (keeping tab and newline), DEL, C1 controls and lone surrogates."""
    if not _has_control(text):
        return text
    if _ESCAPE_OR_CR.search(text):
        text = _CR.sub("\n", _ESCAPES.sub("", text))
    return _CONTROL.sub("", text)


def _strip_control_alone(text: str) -> str:
    """`strip_control` without the escape sequences: each control character alone goes (the rule before
    issue 25), the redactor's second reading of a text whose escape sequences took other characters."""
    return _CONTROL.sub("", _CR.sub("\n", text))


def shannon_entropy(value: str) -> float:
    """Shannon entropy of ``value`` in bits per character (0.0 for the empty string)."""
    if not value:
        return 0.0
    n = len(value)
    return -sum((c / n) * math.log2(c / n) for c in Counter(value).values())


@attrs.frozen
class RedactionRule:
    """One compiled pattern: what it finds, and the conditions a match must meet to be redacted."""

    id: str
    description: str
    pattern: re.Pattern[str]
    #: Minimum Shannon entropy (bits/char) of the secret; None means any match is a secret.
    entropy: float | None = None
    #: A secret that fully matches one of these is left alone (placeholders, code identifiers).
    allowlist: tuple[re.Pattern[str], ...] = ()
    #: Lower-case literals, one of which every match contains: the rule runs only on text holding one
    #: (gitleaks' keyword prefilter). Empty means the rule always runs.
    keywords: tuple[str, ...] = ()
    #: gitleaks' secretGroup: the numbered group that is the secret; 0 means the first group that took
    #: part in the match and is not empty (gitleaks' default), the whole match when there is none.
    #: None (hand-written rules) means the named-group convention below.
    secret_group: int | None = None
    #: A structural detector (``redact_detectors.DETECTORS``) that says which spans of a match are
    #: secrets; None means the match's secret span (below).
    detector: str | None = None
    #: 1: a token found by its own shape (prefixes, key blocks, URL userinfo); 2: a secret found by its
    #: context (a key name, a flag, a header); 3: the wide generic key = value rules, one at a time.
    #: Earlier phases are replaced first, so a context rule sees ``token: [REDACTED]`` rather than
    #: widening a vendor token's span to the words after it.
    phase: int = 1
    #: The pattern is tried only where one of its keywords starts (``re.Pattern.match`` at each
    #: occurrence the keyword automaton found, less each of ``leads``), not at every position: for
    #: rules whose match begins at a keyword (or a fixed distance from one), and which would otherwise
    #: start with a lookbehind or an alternation ``re`` cannot scan for quickly. Set by the rule file,
    #: or found from the pattern itself (`anchor_leads`).
    anchored: bool = False
    #: How far before a keyword's start a match may begin (negative: after it, past a lookbehind).
    leads: tuple[int, ...] = (0,)

    def is_secret(self, value: str) -> bool:
        """Whether a matched ``value`` passes the rule's entropy floor and is not allowlisted."""
        if self.entropy is not None and shannon_entropy(value) < self.entropy:
            return False
        return not any(allowed.fullmatch(value) for allowed in self.allowlist)

    def secret_span(self, match: re.Match[str]) -> tuple[int, int] | None:
        """The span to replace for ``match``, or None when the match is not a secret.

        A pattern may name a group ``secret`` (only it is replaced; otherwise the whole match is) and a
        group ``reject``: when ``reject`` takes part, the match is left alone. ``reject`` lets a pattern
        consume a long run that turned out not to be a secret, so the scan never restarts inside it
        (this keeps every rule linear without relying on backtracking).
        """
        groups = self.pattern.groupindex
        if self.secret_group is not None:
            start, end = match.span()
            if self.secret_group > 0 and match.start(self.secret_group) >= 0:
                start, end = match.span(self.secret_group)
            elif self.secret_group == 0:
                for index in range(1, (self.pattern.groups or 0) + 1):
                    if match.start(index) >= 0 and match.end(index) > match.start(index):
                        start, end = match.span(index)
                        break
        elif "reject" in groups and match.start("reject") >= 0:
            return None
        elif "secret" in groups and match.start("secret") >= 0:
            start, end = match.span("secret")
        else:
            start, end = match.span()
        if not self.is_secret(match.string[start:end]):
            return None
        return start, end

    def _replace(self, match: re.Match[str]) -> str:
        span = self.secret_span(match)
        if span is None:
            return match.group()
        text = match.string
        whole_start, whole_end = match.span()
        return text[whole_start : span[0]] + REDACTED + text[span[1] : whole_end]

    def apply(self, text: str) -> str:
        """Replace every secret this rule finds in ``text`` (one pass)."""
        return _replace_spans(text, list(self.spans(text, lambda t: t)))

    def matches(self, text: str, starts: Sequence[int] | None = None) -> Iterator[re.Match[str]]:
        """The pattern's matches in ``text``; for an anchored rule given the keywords' ``starts``, only
        those beginning at one of them (non-overlapping, as ``finditer``'s)."""
        if not self.anchored or starts is None:
            yield from self.pattern.finditer(text)
            return
        done, limit = 0, len(text)
        leads = self.leads
        at = set(starts) if leads == (0,) else {p - lead for p in starts for lead in leads}
        if len(at) * _DENSE > limit:
            # Keywords every few characters (an adversarial text, a dump of headers): one C scan from the
            # first place a match can begin costs less than a Python call at each; same matches.
            yield from self.pattern.finditer(text, max(min(at), 0))
            return
        for start in sorted(at):
            if start < done or start > limit:
                continue
            match = self.pattern.match(text, start)
            if match is not None:
                done = max(match.end(), start + 1)
                yield match

    def spans(self, text: str, redact: Callable[[str], str],
              starts: Sequence[int] | None = None) -> Iterator[tuple[int, int]]:
        """The spans of ``text`` this rule finds secrets at (``redact``: for a detector that decodes)."""
        if self.detector is not None:
            detect = DETECTORS[self.detector]
            for match in self.matches(text, starts):
                for start, end in detect(match, redact):
                    if end > start and self.is_secret(text[start:end]):
                        yield start, end
            return
        for match in self.matches(text, starts):
            span = self.secret_span(match)
            if span is not None and span[1] > span[0]:
                yield span


#: An anchored rule scans instead when its places are denser than one per this many characters.
_DENSE = 16


def _replace_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with the union of ``spans`` replaced by one marker per run of overlapping or touching
    spans."""
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    done = 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end:
            end = max(end, e)
            continue
        out += [text[done:start], REDACTED]
        done, (start, end) = end, (s, e)
    out += [text[done:start], REDACTED, text[end:]]
    return "".join(out)


def _compile(raw: Mapping[str, Any], source: str) -> RedactionRule:
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not rule_id:
        raise RulesError("redaction rule without an id", file=source)
    try:
        pattern = re.compile(raw["regex"])
        allowlist = tuple(re.compile(p) for p in raw.get("allowlist", ()))
    except (KeyError, TypeError, re.error) as exc:
        raise RulesError(f"invalid redaction rule: {exc}", file=source, key=f"rules.{rule_id}") from exc
    entropy = raw.get("entropy")
    if entropy is not None and not isinstance(entropy, int | float):
        raise RulesError("entropy must be a number", file=source, key=f"rules.{rule_id}.entropy")
    keywords = raw.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k for k in keywords):
        raise RulesError("keywords must be a list of strings", file=source, key=f"rules.{rule_id}.keywords")
    encoded = raw.get("base64_keywords", [])
    if not isinstance(encoded, list) or not all(isinstance(k, str) and k for k in encoded):
        raise RulesError("base64_keywords must be a list of strings", file=source,
                          key=f"rules.{rule_id}.base64_keywords")
    keywords = keywords + [f for word in encoded for f in sorted(base64_fragments(word))]
    anchored = raw.get("anchored", False)
    if not isinstance(anchored, bool) or (anchored and not keywords):
        raise RulesError("anchored must be true or false, and needs keywords", file=source,
                          key=f"rules.{rule_id}.anchored")
    leads = anchor_leads(pattern, keywords)
    anchored = anchored or leads is not None
    phase = raw.get("phase", 1)
    if phase not in (1, 2, 3):
        raise RulesError("phase must be 1, 2 or 3", file=source, key=f"rules.{rule_id}.phase")
    detector = raw.get("detector")
    if detector is not None and detector not in DETECTORS:
        raise RulesError(f"unknown detector {detector!r}", file=source, key=f"rules.{rule_id}.detector")
    group = raw.get("secret_group")
    if group is not None and (not isinstance(group, int) or not 0 <= group <= pattern.groups):
        raise RulesError("secret_group must name a group", file=source, key=f"rules.{rule_id}.secret_group")
    rule = RedactionRule(
        id=rule_id,
        description=str(raw.get("description", "")),
        pattern=pattern,
        entropy=None if entropy is None else float(entropy),
        allowlist=allowlist,
        keywords=tuple(sorted({k.lower() for k in keywords})),
        secret_group=group,
        detector=detector,
        phase=phase,
        anchored=anchored,
        leads=leads or (0,),
    )
    if _matches_marker(rule):
        raise RulesError("redaction rule matches the [REDACTED] marker", file=source, key=f"rules.{rule_id}")
    return rule


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


def _matches_marker(rule: RedactionRule) -> bool:
    """Whether a rule would redact any part of a marker, which would break idempotence."""
    for probe in (REDACTED, f"{REDACTED}{REDACTED}", f"x={REDACTED}", f"://{REDACTED}@h"):
        markers = [(m.start(), m.end()) for m in re.finditer(re.escape(REDACTED), probe)]
        for span in rule.spans(probe, lambda t: t):
            if any(span[0] < end and start < span[1] for start, end in markers):
                return True
    return False


def load_rules(data: bytes | None = None, *, source: str = "memactors.data/redaction_rules.toml") -> tuple[
    RedactionRule, ...
]:
    """Compile the rule file (the packaged one when ``data`` is None); raises RulesError if it is invalid."""
    if data is None:
        data = resources.files("memactors.data").joinpath("redaction_rules.toml").read_bytes()
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RulesError(f"cannot parse redaction rules: {exc}", file=source) from exc
    raw_rules = document.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise RulesError("no [[rules]] in redaction rules", file=source)
    return tuple(_compile(raw, source) for raw in _expand(raw_rules, source))


def _expand(raw_rules: list[Any], source: str) -> list[Any]:
    """The rules with each ``include = "gitleaks"`` entry replaced by gitleaks' whole default rule set
    (``gitleaks_rules``: read from the installed package, translated), in place, so the order of the
    file is the order of application."""
    if not any(isinstance(raw, Mapping) and "include" in raw for raw in raw_rules):
        return raw_rules
    ours = frozenset(raw["id"] for raw in raw_rules if isinstance(raw, Mapping) and isinstance(raw.get("id"), str))
    out: list[Any] = []
    for raw in raw_rules:
        if isinstance(raw, Mapping) and "include" in raw:
            if raw["include"] != "gitleaks":
                raise RulesError(f"unknown rule include {raw['include']!r}", file=source)
            from . import gitleaks_rules  # read only when a rule file asks for it

            try:
                out += gitleaks_rules.rules(ours)
            except gitleaks_rules.GitleaksError as exc:
                raise RulesError(str(exc), file=source) from exc
        else:
            out.append(raw)
    return out


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


_SHARED: list[Redactor] = []
#: True while the shared rules compile: a ConfigError raised by a broken rule is then not redacted
#: (there is no redactor yet to do it, and asking for one would compile the rules again).
_COMPILING = False


def _shared() -> Redactor:
    global _COMPILING
    if not _SHARED:
        _COMPILING = True
        try:
            _SHARED.append(Redactor())
        finally:
            _COMPILING = False
    return _SHARED[0]


def redact_config_error(message: str, context: dict[str, object]) -> tuple[str, dict[str, object]]:
    """A ConfigError's message and context values, redacted (as they are while the rules compile)."""
    if _COMPILING:
        return message, context
    return redact(message), {k: redact_obj(v) if isinstance(v, str | list | tuple | dict) else v
                             for k, v in context.items()}


def shared() -> Redactor:
    """The daemon's shared redactor, compiling the rules on the first call (call it off the event loop)."""
    return _shared()


def __getattr__(name: str) -> Any:
    # ``default`` is compiled on first use, not at import: the rule set is a few hundred patterns and a
    # CLI command that never redacts should not pay for them.
    if name == "default":
        return _shared()
    raise AttributeError(name)


def redact(text: str) -> str:
    """Redact ``text`` with the shared rule set (see :class:`Redactor`)."""
    return _shared().redact(text)


def redact_many(texts: Sequence[str]) -> list[str]:
    """`redact` of each string, with one keyword pass for them all (see :meth:`Redactor.redact_many`)."""
    return _shared().redact_many(texts)


def redact_obj(value: Any) -> Any:
    """Redact every string inside a nested dict/list/tuple with the shared rule set."""
    return _shared().redact_obj(value)


def rule_ids(rules: Iterable[RedactionRule] | None = None) -> list[str]:
    """The ids of the given (default: shared) rules, in the order they are applied."""
    return [rule.id for rule in (_shared().rules if rules is None else rules)]


#: A private key block's first and last lines (PEM, OpenSSH, PKCS#8, encrypted, PGP armor; an SSH2
#: block; a PuTTY .ppk file, which begins with its PuTTY-User-Key-File line and ends with Private-MAC).
_BLOCK_BEGIN = re.compile(r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
                          r"|---- BEGIN SSH2 (?:ENCRYPTED )?PRIVATE KEY ----|(?i:PuTTY-User-Key-File-[0-9]{1,3}:)")
_BLOCK_END = re.compile(r"-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
                        r"|---- END SSH2 (?:ENCRYPTED )?PRIVATE KEY ----|(?i:Private-MAC:)[ \t]*[0-9A-Fa-f]*")
#: A line inside such a block: base64 (standard or url-safe; empty lines too), an armor or PEM header
#: (``Version: GnuPG``, ``Proc-Type: 4,ENCRYPTED``, ``DEK-Info: …``), a PGP checksum (``=ab12``).
_BLOCK_BODY = re.compile(r"[A-Za-z0-9+/=_-]*|[A-Za-z][A-Za-z0-9-]{0,40}:[^\n]*")


class LineRedactor:
    """Redacts a text that arrives one line at a time (a provider's stderr) as :func:`redact` redacts
    a whole text, multi-line secrets included.

    Each line alone would pass a private key's body: its lines are plain base64 and carry no keyword,
    and its ``BEGIN`` line alone has no key material after it. So a ``BEGIN … PRIVATE KEY`` line
    without its ``END`` on the same line opens a block: the line becomes ``[REDACTED]`` from the
    marker on, and every following line that reads as key material (base64, an armor header, a PGP
    checksum, a blank line) is dropped, up to and including the ``END`` line (what follows ``END`` on
    that line is kept, redacted). A line that is not key material ends the block (a truncated key, or a
    bare header in code) and is redacted as usual; so does the ``max_block_lines``-th line. Every other
    line goes through the redactor as it is.
    """

    def __init__(self, redactor: Redactor | None = None, max_block_lines: int = 1000,
                 context_lines: int = 32, context_chars: int = 8192) -> None:
        self._redactor = redactor or _shared()
        self._redact = self._redactor.redact
        self._max = max_block_lines
        self._in_block: int | None = None  # lines dropped so far in the open block
        # The lines before (stripped, in memory only): a secret whose context is on an earlier line
        # (a Secret's stringData: header, `password: |`, `cat config/master.key`) is found in them.
        self._context: collections.deque[str] = collections.deque(maxlen=context_lines)
        self._context_chars = context_chars

    def _in_context(self, text: str) -> str:
        """``text`` redacted as the last line of the recent lines: the spans found in the joined text
        that fall on this line are replaced, then the line is redacted alone as well."""
        text = strip_control(text)
        context = "\n".join(self._context)[-self._context_chars :]
        self._context.append(text[: self._context_chars])
        if not context:
            return self._redact(text)
        joined = f"{context}\n{text}"
        offset = len(joined) - len(text)
        spans = [(max(a, offset) - offset, b - offset) for a, b in self._redactor.secret_spans(joined) if b > offset]
        return self._redact(_replace_spans(text, spans))

    def line(self, text: str) -> str | None:
        """The line to show for ``text``, redacted, or None when it is part of a key block (dropped)."""
        if self._in_block is not None:
            end = _BLOCK_END.search(text)
            if end is not None:
                self._in_block = None
                rest = text[end.end() :]
                return self._in_context(rest) if rest.strip() else None
            if self._in_block < self._max and _BLOCK_BODY.fullmatch(text.strip()):
                self._in_block += 1
                return None
            self._in_block = None
        begin = _BLOCK_BEGIN.search(text)
        if begin is not None and _BLOCK_END.search(text, begin.end()) is None:
            self._in_block = 0
            return self._in_context(text[: begin.start()]) + REDACTED
        return self._in_context(text)


#: A line of key material proper (base64, a PGP checksum): what a key block's body lines are. Narrower
#: than _BLOCK_BODY, which also takes `Name: value` header lines — an error message looks like one.
_KEY_MATERIAL = re.compile(r"[A-Za-z0-9+/=_-]{16,}|=[A-Za-z0-9+/]{4}")


def redact_tail(text: str) -> str:
    """`redact` for a text whose beginning may have been cut off (the last bytes of a stream).

    A key block whose ``BEGIN`` line fell before the cut has no marker left to find it by: `redact`
    would pass its body lines. So the key-material lines (base64 of 16 characters or more, a PGP
    checksum, blank lines between them) just before an ``END … PRIVATE KEY`` line that has no ``BEGIN``
    before it become ``[REDACTED]`` with that line; the rest is redacted as usual. Linear: each orphan
    ``END`` is looked at once, and lines are walked back from it only to the previous one.
    """
    out: list[str] = []
    done = 0  # text[:done] is settled: either in `out`, or left for the final redact of text[done:]
    for end in _BLOCK_END.finditer(text):
        if _BLOCK_BEGIN.search(text, done, end.start()) is not None:
            break  # a whole block from here on: `redact` finds it from its BEGIN
        line_start = text.rfind("\n", done, end.start()) + 1 if done < end.start() else done
        head = text[max(line_start, done):end.start()].strip()
        if head and not _KEY_MATERIAL.fullmatch(head):
            continue  # END after other text on its line: not the tail of a key block
        start = max(line_start, done)
        while start > done:
            previous = max(text.rfind("\n", done, start - 1) + 1, done)
            line = text[previous:start - 1].strip()
            if line and not _KEY_MATERIAL.fullmatch(line):
                break
            start = previous
        out += [redact(text[done:start]), REDACTED]
        done = end.end()
    return "".join(out) + redact(text[done:])
