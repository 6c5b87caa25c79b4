"""Redaction rules: the rule file compiled into patterns, and what one rule finds in a text.

The rule file is data (``memactors/data/redaction_rules.toml``); each entry becomes one
:class:`RedactionRule`, checked as it compiles (a malformed entry raises :class:`RulesError` naming the
file and the rule's key; a rule that would redact part of the ``[REDACTED]`` marker is refused, since
it would break idempotence).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import attrs

from ._anchor import anchor_leads
from ._detectors import DETECTORS, base64_fragments

#: The literal that replaces every secret.
REDACTED = "[REDACTED]"


class RulesError(ValueError):
    """Raised when a redaction rule file is malformed (the packaged one never is: tests/redact/test_redact.py
    loads it); names the file and the rule's key.

    Not a ``ConfigError``: this module imports nothing of memactors, because ``errors.ConfigError`` masks
    the values it carries through ``urls``, and ``urls`` masks a URL's path with this redactor.
    """

    def __init__(self, message: str, *, file: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.key = key

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
    #: A structural detector (``_detectors.DETECTORS``) that says which spans of a match are
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
            from .. import gitleaks_rules  # read only when a rule file asks for it

            try:
                out += gitleaks_rules.rules(ours)
            except gitleaks_rules.GitleaksError as exc:
                raise RulesError(str(exc), file=source) from exc
        else:
            out.append(raw)
    return out


