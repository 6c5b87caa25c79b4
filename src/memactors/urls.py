"""Showing a URL without its credentials: the one function every surface uses to print or log a URL.

An upstream's URL is configuration, and operators put credentials in it (``http://svc:PASS@host/mcp``,
``?api_key=…``, a token as a path segment, a signed ``?sig=…``). Config errors, ``memactors doctor``,
``memory status``, the provider's last error and the daemon's log all print it back: each of them goes
through :func:`mask_url` (or :func:`mask_urls` for a URL inside a message, such as an HTTP client's
error), which keeps what an operator needs to recognise the URL — scheme, user name, host, port, path,
parameter names — and replaces what could be a credential with ``[REDACTED]``:

* the password of the userinfo; a userinfo without one is a user name (``postgresql://memactors@db``,
  shown: an operator needs to know who connects where) except on the web schemes, where it
  is a token (``https://TOKEN@host``), or when it looks like one (the redactor finds a secret in it, or
  it is long and random-looking);
* the value of every query or fragment parameter whose name looks like a credential (``key``, ``token``,
  ``secret``, ``password``, ``sig``, ``signature``, ``auth``, ``credential``, ``session``, ``code``,
  ``hash``, ``refresh``, ``hmac``, ``salt``, …, anywhere in the name: ``api_key``, ``access_token``,
  ``X-Amz-Signature``, ``refresh_token``);
* a path segment the shared redactor finds a secret in (a Slack or Discord webhook token, a Telegram
  bot token), or a long random-looking one (24+ characters of letters and digits at 3.5+ bits of
  entropy: a hosted MCP server's key in its URL).

It is idempotent, and never raises: text that is not a URL is returned as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["MASK", "mask_url", "mask_urls", "mask_values"]

#: What replaces a credential: the redactor's marker, so every surface says the same thing.
MASK = "[REDACTED]"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}://")
#: A URL inside free text: a scheme, then up to whitespace, a quote, an angle bracket or a backtick.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s\"'<>`]+")
#: A parameter name that may carry a credential (compared lower-cased, anywhere in the name).
_CREDENTIAL_NAME = re.compile(
    r"key|token|secret|pass|pwd|^pw$|sig|auth|credential|session|jwt|bearer|^code$|private|otp|hash|refresh"
    r"|hmac|salt|nonce|cookie")
#: Schemes whose bare userinfo (no password) is a token by convention (``https://TOKEN@forge``).
_TOKEN_USERINFO_SCHEMES = ("http://", "https://", "ws://", "wss://", "git+https://", "git+http://")
_SEGMENT = re.compile(r"[A-Za-z0-9_.~+=-]{24,}")


def mask_url(url: str) -> str:
    """``url`` with its credentials replaced by ``[REDACTED]`` (see the module's docstring)."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return url
    head, rest = url[: scheme.end()], url[scheme.end() :]
    authority_end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, rest = rest[:authority_end], rest[authority_end:]
    userinfo, at, hostport = authority.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        if colon and user:
            authority = f"{user}:{MASK}@{hostport}"
        elif colon or not _is_user_name(head, user):
            authority = f"{MASK}@{hostport}"
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    path = _mask_path(head + authority, path)
    if question:
        query = _mask_params(query)
    if hash_ and "=" in fragment:
        fragment = _mask_params(fragment)
    return head + authority + path + question + query + hash_ + fragment


def mask_urls(text: str) -> str:
    """Every URL inside ``text`` through :func:`mask_url`; the rest of the text unchanged."""
    if "://" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        url = match.group()
        core = url.rstrip(".,;:!?)]}")  # the sentence's punctuation after a URL is not part of it
        if core.endswith(MASK[:-1]) and url[len(core) :].startswith("]"):
            core += "]"  # ... but the "]" of a marker the redactor put there is
        return mask_url(core) + url[len(core) :]

    return _URL_IN_TEXT.sub(one, text)


def mask_values(value: Any) -> Any:
    """:func:`mask_urls` over every string inside nested dicts, lists and tuples (config values)."""
    return _walk(value, mask_urls)


def _walk(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: _walk(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(_walk(v, fn) for v in value)
    return value


def _mask_params(params: str) -> str:
    out = []
    for pair in params.split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and value != MASK and _CREDENTIAL_NAME.search(name.lower()):
            pair = f"{name}={MASK}"
        out.append(pair)
    return "&".join(out)


def _is_user_name(head: str, user: str) -> bool:
    """A bare userinfo that is a user name to show, not a token to hide."""
    if not user or user == MASK or head.lower().startswith(_TOKEN_USERINFO_SCHEMES):
        return user == MASK
    from .redact import redact, shannon_entropy

    if redact(user) != user:
        return False
    return not (len(user) >= 20 and re.search(r"[A-Za-z]", user) and re.search(r"[0-9]", user)
                and shannon_entropy(user) >= 3.5)


def _mask_path(prefix: str, path: str) -> str:
    if not path or path == "/":
        return path
    from .redact import REDACTED, redact, shannon_entropy  # the rules compile on first use: only here

    assert REDACTED == MASK
    # Vendor rules match on host and path together (hooks.slack.com/services/…); the prefix is kept.
    redacted = redact(prefix + path)
    if redacted.startswith(prefix):
        path = redacted[len(prefix) :]
    segments = path.split("/")
    for n, segment in enumerate(segments):
        if (_SEGMENT.fullmatch(segment) and re.search(r"[A-Za-z]", segment) and re.search(r"[0-9]", segment)
                and shannon_entropy(segment) >= 3.5):
            segments[n] = MASK
    return "/".join(segments)
