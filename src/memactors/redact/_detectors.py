"""Structural detectors: secrets a pattern finds the place of but cannot delimit alone.

A rule of ``data/redaction_rules.toml`` may name a ``detector``: its pattern finds a region (a
Kubernetes Secret's ``data:`` block, a base64 run) and the detector says which spans inside it are
secrets. Each detector gets the match and a ``redact`` function (the redactor itself, for a decoded
blob) and returns spans of ``match.string``.

* ``k8s-secret-yaml`` / ``k8s-secret-json``: every value of a Secret's ``data`` / ``stringData`` (in YAML
  block form, or ``kubectl get secret -o json``), whatever it looks like: a Secret's values are secret
  by definition, and base64 of a short password has no shape to recognise. ``data:`` counts only in a
  text that says ``kind: Secret``; ``stringData`` exists only in Secrets.
* ``base64-credential``: a base64 (or base64url) run that decodes to text the redactor would redact —
  a service-account JSON, a docker config, a key block, an env file — is replaced whole. The rule's
  keywords are the base64 spellings of credential words at each of the three alignments
  (``base64_keywords`` in the rule file), so only text holding an encoded credential word decodes
  anything.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable

Span = tuple[int, int]
Detector = Callable[[re.Match[str], Callable[[str], str]], Iterable[Span]]

_KIND_SECRET_YAML = re.compile(r"""(?im)^[ \t]*kind:[ \t]*["']?secret["']?[ \t]*$""")
_KIND_SECRET_JSON = re.compile(r""""kind"\s*:\s*"Secret\"""")
_YAML_LINE = re.compile(r"[^\r\n]*")
_YAML_VALUE = re.compile(r"""[ \t]*(?:-[ \t]+)?["']?[\w.-]{1,253}["']?[ \t]*:[ \t]*""")
_JSON_VALUE = re.compile(r'"(?:[^"\\]|\\.){0,253}"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _k8s_yaml(match: re.Match[str], redact: Callable[[str], str]) -> Iterable[Span]:
    if match.group("field").lower() != "stringdata" and _KIND_SECRET_YAML.search(match.string) is None:
        return
    start = match.start("body")
    for line in _YAML_LINE.finditer(match.string, start, match.end("body")):
        text = line.group()
        if not text.strip():
            continue
        key = _YAML_VALUE.match(text)
        value_at = line.start() + (key.end() if key is not None else len(text) - len(text.lstrip()))
        value = match.string[value_at : line.end()].rstrip()
        if value and value not in ("|", ">", "|-", ">-", "|+", ">+"):
            yield value_at, value_at + len(value)


def _k8s_json(match: re.Match[str], redact: Callable[[str], str]) -> Iterable[Span]:
    if match.group("field").lower() != '"stringdata"' and _KIND_SECRET_JSON.search(match.string) is None:
        return
    for value in _JSON_VALUE.finditer(match.string, match.start("body"), match.end("body")):
        if value.end(1) > value.start(1):
            yield value.span(1)


_FLAT_PAIR = re.compile(r"([\w.-]{1,253}):[ \t]++([^\s]++)")


def _k8s_flat(match: re.Match[str], redact: Callable[[str], str]) -> Iterable[Span]:
    if match.group("field").lower() != "stringdata" and _KIND_SECRET_FLAT.search(match.string) is None:
        return
    for pair in _FLAT_PAIR.finditer(match.string, match.start("body"), match.end("body")):
        if pair.group(1) in ("apiVersion", "kind", "metadata", "type"):
            break  # the next document's fields: the Secret's data ended
        yield pair.span(2)


_KIND_SECRET_FLAT = re.compile(r"""(?i)\bkind:[ \t]*["']?secret\b""")
_PRINTABLE = re.compile(r"[\t\n\r -~\u00a0-\uffff]*")


def decode_base64(run: str) -> str | None:
    """``run`` decoded as standard or url-safe base64 into text, or None when it is neither (or binary)."""
    padded = run + "=" * (-len(run) % 4)
    for altchars in (None, b"-_"):
        try:
            raw = base64.b64decode(padded, altchars=altchars, validate=True)
        except (binascii.Error, ValueError):
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return text if _PRINTABLE.fullmatch(text) else None
    return None


def _base64_credential(match: re.Match[str], redact: Callable[[str], str]) -> Iterable[Span]:
    run = match.group("secret")
    decoded = decode_base64(run.rstrip("="))
    if decoded is not None and len(decoded) >= 8 and redact(decoded) != decoded:
        yield match.span("secret")


_COOKIE_PAIR = re.compile(r"[ \t]*([^=;,\s]{1,256})[ \t]*=[ \t]*([^;]*)")
_COOKIE_ATTRIBUTES = frozenset({"path", "domain", "expires", "max-age", "samesite", "secure", "httponly", "priority",
                                "partitioned", "version", "comment", "commenturl", "discard", "port"})


def _cookie_values(match: re.Match[str], redact: Callable[[str], str]) -> Iterable[Span]:
    """The value of every cookie in a Cookie / Set-Cookie header (attributes such as Path are kept)."""
    start, end = match.span("secret")
    for pair in _COOKIE_PAIR.finditer(match.string, start, end):
        if pair.group(1).lower() in _COOKIE_ATTRIBUTES:
            continue
        value = pair.group(2).rstrip()
        if value and value != "[REDACTED]":
            yield pair.start(2), pair.start(2) + len(value)


DETECTORS: dict[str, Detector] = {
    "cookie-values": _cookie_values,
    "k8s-secret-yaml": _k8s_yaml,
    "k8s-secret-json": _k8s_json,
    "k8s-secret-flat": _k8s_flat,
    "base64-credential": _base64_credential,
}


def base64_fragments(word: str) -> set[str]:
    """The lower-cased substrings that every standard or url-safe base64 encoding of a text holding
    ``word`` contains, at one of the three byte alignments (the encoded characters that depend on
    ``word``'s bytes only)."""
    data = word.encode("utf-8")
    out: set[str] = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + data).decode("ascii")
        first = -(-8 * shift // 6)
        last = (8 * (shift + len(data))) // 6
        fragment = encoded[first:last]
        if len(fragment) >= 4:
            out |= {fragment.lower(), fragment.replace("+", "-").replace("/", "_").lower()}
    return out
