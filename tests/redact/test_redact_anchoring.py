"""Anchored rules (what keeps ingest cheap): a rule whose every match begins at a fixed place from one of
its keywords is tried only there, and that must change no result.

`anchor_leads` reads a pattern's literal beginning; these tests pin what it proves and what it refuses,
then compare the shared redactor with one whose rules all scan, over the generated corpus and
texts built from it (joined, case-changed, with the Unicode letters ``re`` folds to ASCII).
"""

from __future__ import annotations

import random
import re

import attrs
import pytest

from memactors.redact import REDACTED, Redactor, anchor_leads, default
from support_corpus import full


@pytest.mark.parametrize(("pattern", "keywords", "leads"), [
    (r"(?i:passw(?:or)?d|passphrase|\bpwd)[ \t]*=", ("passw", "passphrase", "pwd"), (0,)),
    (r"(?i:\b(?:proxy-)?authorization):", ("authorization",), (0, 6)),
    (r"(?<=://)(?P<secret>[^@]+)@", ("://",), (-3,)),
    (r"(?:HTTPBasicAuth|(?i:\bauth))\(", ("auth",), (0, 9)),
    (r"\b[Gg]hp_[0-9a-z]{36}", ("ghp_",), (0,)),
    (r"x?token", ("token",), (0, 1)),
])
def test_a_pattern_that_begins_with_a_keyword_is_anchored_at_it(pattern: str, keywords: tuple[str, ...],
                                                                 leads: tuple[int, ...]) -> None:
    assert anchor_leads(re.compile(pattern), keywords) == leads


@pytest.mark.parametrize(("pattern", "keywords"), [
    (r"[a-z0-9]{6}\.(?P<secret>[a-z0-9]{16})", ("token",)),  # the keyword is context, not the match
    (r"(?i:secret|password)=", ("secret",)),  # a branch without a keyword
    (r"ab", ("abc",)),  # a match can end before the keyword does
    (r"(?:ab)+c", ("abc",)),  # a repetition: its later rounds are not followed
    (r"-{5}BEGIN[ A-Z]{0,100}PRIVATE KEY", ("private key",)),  # the keyword after a class
    (r"key", ()),
])
def test_a_pattern_that_can_begin_elsewhere_scans(pattern: str, keywords: tuple[str, ...]) -> None:
    assert anchor_leads(re.compile(pattern), keywords) is None


def test_most_of_the_shared_rules_are_anchored() -> None:
    anchored = [rule for rule in default.rules if rule.anchored]
    assert len(anchored) >= 0.8 * len(default.rules)
    by_id = {rule.id: rule for rule in default.rules}
    assert by_id["generic-secret-assignment"].anchored
    assert by_id["url-userinfo-password"].leads == (-3,)


def _texts() -> list[str]:
    base = [sample.text for sample in full()]
    rng = random.Random(31)
    out = list(base)
    for _ in range(600):
        text = rng.choice(base) + rng.choice([" ", "\n", "", "x", "://", "-", "ſ", "ı", "K", "é"]) + rng.choice(base)
        if rng.random() < 0.3:
            text = text.swapcase()
        out.append(text)
    out += [text.replace("s", "ſ").replace("i", "ı") for text in base]
    return out


def test_anchored_rules_find_what_scanning_rules_find() -> None:
    scanning = Redactor(rules=tuple(attrs.evolve(rule, anchored=False) for rule in default.rules))
    texts = _texts()
    differ = [text for text in texts if default.redact(text) != scanning.redact(text)]
    assert differ == []
    assert default.redact_many(texts[:200]) == [scanning.redact(text) for text in texts[:200]]


def test_a_keyword_spelt_with_a_letter_re_folds_to_ascii_is_found() -> None:
    # `re` matches ſ (long s) to s and ı (dotless i) to i case-insensitively; str.lower keeps them.
    for text in ("\u017fecret=9og82rg7kc0yx2q7hufW", "pa\u017f\u017fword: 9og82rg7kc0yx2q7hufW",
                 "Authorızatıon: Bearer 9og82rg7kc0yx2q7hufWmQ3"):
        assert REDACTED in default.redact(text), text
        assert "9og82rg7kc0yx2q7huf" not in default.redact(text)
