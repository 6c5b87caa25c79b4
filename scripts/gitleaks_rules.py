"""Regenerate the gitleaks-derived block of src/memactors/data/redaction_rules.toml.

Usage: python scripts/gitleaks_rules.py path/to/gitleaks/config/gitleaks.toml [commit]

Reads gitleaks' default config (MIT License, Copyright (c) 2019 Zachary Rice), translates each rule's
RE2 pattern to Python's `re` and writes the rules, with their keywords, entropy and secret group, between
the BEGIN/END markers of the rule file. The hand-written rules outside the markers stay as they are.

Translation (RE2 -> Python `re`), every step widening rather than narrowing what is redacted:
  * a `(?i)` that is not at the start becomes a scoped `(?i:...)` up to the end of its enclosing group;
  * `\\z` becomes `\\Z`; POSIX classes `[:alnum:]` etc. are spelled out;
  * gitleaks' end-of-secret group (a quote, whitespace, `;`, an escaped newline or the end) also accepts
    ordinary punctuation (`. , : ! ? ) ] } > | & < ( /`), so "paid with sk_live_....", a key at the end
    of a sentence, is redacted too;
  * the lazy `[\\w.-]{0,50}?` prefix of keyword-assignment rules is dropped (it only widens the reported
    match, and costs a backtracking engine ~1000 steps per character; the secret group is unchanged);
  * an unbounded `.*` (the curl rules) is bounded to `.{0,256}`: a backtracking engine would rescan
    the rest of a long line at every occurrence of the keyword;
  * gitleaks' rule allowlists and `path` conditions are dropped (a redactor errs towards redacting; the
    `path` condition has no meaning for agent text); rules without a regex (file-name-only) are skipped;
  * rules whose id names a hand-written rule of ours are skipped (ours replace them), as is
    `generic-api-key` (our generic-* rules replace it).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

RULES = Path(__file__).resolve().parent.parent / "src/memactors/data/redaction_rules.toml"
BEGIN = "# --- BEGIN gitleaks-generated (scripts/gitleaks_rules.py; do not edit by hand) ---"
END = "# --- END gitleaks-generated ---"
POSIX = {"alnum": "A-Za-z0-9", "alpha": "A-Za-z", "digit": "0-9", "upper": "A-Z", "lower": "a-z",
         "xdigit": "0-9A-Fa-f", "space": r" \t\r\n\v\f", "punct": r"!-/:-@\[-`{-~", "word": r"\w"}


def _group_end(pattern: str, start: int) -> int:
    """Index of the ')' closing the group that encloses `start` (len(pattern) when at top level)."""
    depth, i, in_class = 0, start, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return len(pattern)


GITLEAKS_END = r"""(?:[\x60'"\s;]|\\[nr]|$)"""
WIDER_END = r"""(?:[\x60'"\s;.,:!?)\]}>|&<(/]|\\[nr]|$)"""


LAZY_PREFIX = r"[\w.-]{0,50}?"


def to_python(pattern: str) -> str:
    """Translate one gitleaks (RE2) pattern to Python `re` syntax."""
    pattern = pattern.replace(GITLEAKS_END, WIDER_END)
    # gitleaks' keyword-assignment rules open with a lazy identifier prefix that only widens the
    # reported match; in a backtracking engine it costs ~1000 steps per character of text holding the
    # keyword. The secret is a later group, so the match starts at the keyword instead.
    pattern = re.sub(r"\[:(\w+):\]", lambda m: POSIX[m.group(1)], pattern)
    pattern = pattern.replace(r"\z", r"\Z")
    while True:
        at = pattern.find("(?i)", 1)
        if at < 0:
            break
        end = _group_end(pattern, at + 4)
        pattern = pattern[:at] + "(?i:" + pattern[at + 4 : end] + ")" + pattern[end:]
    # An unbounded `.*` after a keyword rescans the rest of the line at every keyword occurrence
    # (quadratic in a long line holding the keyword many times); 256 characters bound it.
    pattern = re.sub(r"(?<!\\)\.\*(\??)", r".{0,256}\1", pattern)
    stripped = True
    while stripped:
        stripped = False
        for head in ("", "(?i)", "(?i:"):
            if pattern.startswith(head + LAZY_PREFIX):
                pattern = head + pattern[len(head + LAZY_PREFIX) :]
                stripped = True
    return pattern


def _toml_str(value: str) -> str:
    if "'''" not in value and not value.endswith("'"):
        return f"'''{value}'''"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate(source: dict, skip: set[str], commit: str) -> str:
    out = [BEGIN, f"# gitleaks config/gitleaks.toml at commit {commit}; {len(source['rules'])} rules read."]
    kept = 0
    for rule in source["rules"]:
        rid = rule["id"]
        if "regex" not in rule or rid in skip:
            continue
        regex = to_python(rule["regex"])
        compiled = re.compile(regex)
        group = int(rule.get("secretGroup", 0))
        if group > compiled.groups:
            group = 0
        out += ["", "[[rules]]", f'id = "{rid}"', f"description = {_toml_str(rule.get('description', ''))}",
                f"regex = {_toml_str(regex)}", f"secret_group = {group}"]
        if "entropy" in rule:
            out.append(f"entropy = {rule['entropy']}")
        keywords = sorted({k.lower() for k in rule.get("keywords", [])})
        out.append("keywords = [" + ", ".join(_toml_str(k) if "\\" in k else f'"{k}"' for k in keywords) + "]")
        kept += 1
    out[1] += f" {kept} kept."
    out.append(END)
    return "\n".join(out)


def main(argv: list[str]) -> None:
    source = tomllib.loads(Path(argv[1]).read_text("utf-8"))
    commit = argv[2] if len(argv) > 2 else "unknown"
    current = RULES.read_text("utf-8")
    head, _, rest = current.partition(BEGIN)
    _, _, tail = rest.partition(END)
    ours = {r["id"] for r in tomllib.loads(head + tail)["rules"]}
    block = generate(source, ours | {"generic-api-key"}, commit)
    RULES.write_text(head + block + tail, "utf-8")


if __name__ == "__main__":
    main(sys.argv)
