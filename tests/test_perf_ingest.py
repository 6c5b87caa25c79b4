"""Issue 11, ingest at the speed of SQLite: the fast paths of the write path give the answers of the
reference paths they stand in front of, and a batch is one write transaction with per-record results.

No timings here (speed belongs in bench/): these tests pin the behaviour the fast paths must keep.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from memactors._wire import _fast_valid, _run_record_validator, parse_run_record
from memactors.errors import InvalidArgument
from support import run_record

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _examples() -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(EXAMPLES.glob("run-*.json"))]


def _instances() -> list[Any]:
    """Valid records and records broken in every way the schema checks (type, enum, pattern, bounds,
    required, extra nesting), plus values that are not plain JSON."""
    out: list[Any] = [*_examples(), run_record()]
    base = run_record()
    for key, value in [
        ("harness", 7), ("harness", ""), ("harness", "x" * 10_000), ("harness", "bad\nname"),
        ("harness", "trailing\n"), ("outcome", "maybe"), ("reason", None), ("duration_ms", -1),
        ("duration_ms", "600"), ("started_at", "yesterday"), ("started_at", "2026-11-28T09:00:00Z\n"),
        ("ended_at", "2026-13-28 09:00:00"), ("spawned_process", "yes"), ("sessions", []),
        ("sessions", [{"cwd": "/srv/api"}]), ("sessions", [{"session_id": "s1", "cwd": 3}]),
        ("events", [{"kind": "edit"}]), ("events", [{"kind": "nope", "session_id": "s1", "at": "x"}]),
        ("events", "none"), ("result_text", ["a"]), ("model", {"served": 1}), ("trigger", {"source": 5}),
        ("cost_usd", "1"), ("prompt", {"x": 1}),
    ]:
        broken = copy.deepcopy(base)
        broken[key] = value
        out.append(broken)
    missing = copy.deepcopy(base)
    del missing["run_id"]
    out.append(missing)
    as_tuple = copy.deepcopy(base)
    as_tuple["sessions"] = tuple(as_tuple["sessions"])  # jsonschema: not an array
    out.append(as_tuple)
    out.append({**copy.deepcopy(base), 3: "non-string key"})
    return out


def test_issue11_the_compiled_run_record_check_passes_only_what_jsonschema_passes() -> None:
    reference = _run_record_validator()
    seen_valid = seen_invalid = 0
    for instance in _instances():
        valid = not any(True for _ in reference.iter_errors(instance)) if isinstance(instance, dict) else False
        if _fast_valid(instance):
            assert valid, instance  # never a record jsonschema refuses
        seen_valid += valid
        seen_invalid += not valid
    assert seen_valid >= 5 and seen_invalid >= 20
    # Valid plain records take the fast path (the point of it). A value ending in a line break is the
    # one place the two differ: jsonschema's `$` (Python's re) matches before it, the compiled one does
    # not, so such a record is left to jsonschema, which accepts it as before.
    for valid in [*_examples(), run_record()]:
        assert _fast_valid(valid)
    trailing = run_record(harness="trailing\n")
    assert not _fast_valid(trailing) and parse_run_record(trailing).harness == "trailing\n"


@pytest.mark.parametrize("key, value, field", [
    ("outcome", "maybe", "outcome"), ("duration_ms", -1, "duration_ms"),
    ("started_at", "yesterday", "started_at"), ("harness", "bad\nname", "harness"),
])
def test_issue11_a_refused_record_still_names_its_field(key: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_run_record(run_record(**{key: value}), source="r.json")
    assert info.value.context.get("field") == field and "r.json" in str(info.value)


def _candidates_by_scan(redactor: Any, text: str) -> list[str]:
    """The reference: each keyword tested with `in` on the lower-cased text (the old loop)."""
    lowered = text.lower()
    chosen = set(redactor._always)
    for k in redactor._keywords:
        if k in lowered:
            chosen.update(redactor._by_keyword[k])
    return [redactor.rules[i].id for i in sorted(chosen)]


def test_issue11_the_keyword_automaton_picks_the_rules_the_keyword_scan_picks() -> None:
    import random

    from memactors.redact import shared

    redactor = shared()
    keywords = list(redactor._keywords)
    rng = random.Random(11)
    texts = ["", "plain words about the ledger", "SK-LIVE and AKIA and ghp_ in caps", "Straße İstanbul ﬁle"]
    for _ in range(300):  # random prose with keywords (overlapping, nested, upper-cased) spliced in
        parts = []
        for _ in range(rng.randint(1, 12)):
            word = rng.choice(keywords) if rng.random() < 0.4 else "".join(
                rng.choice("abcdefghijklmnopqrstuvwxyz_-.:/~0123456789") for _ in range(rng.randint(1, 9)))
            parts.append(word.upper() if rng.random() < 0.2 else word)
        texts.append(rng.choice(["", " ", "-"]).join(parts))
    picked_some = 0
    for text in texts:
        expected = _candidates_by_scan(redactor, text)
        assert [r.id for r in redactor.candidates(text)] == expected, text
        picked_some += len(expected) > len(redactor._always)
    assert picked_some > 100  # the texts did exercise keyword rules
