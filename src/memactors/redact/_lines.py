"""Redaction of a text that arrives a line at a time, or whose beginning was cut off.

A private key block spans lines, and each of its body lines alone looks like harmless base64: the
:class:`LineRedactor` (a provider's stderr) and :func:`redact_tail` (the last bytes of a stream) find
such blocks by their ``BEGIN`` / ``END`` lines and redact them whole.
"""

from __future__ import annotations

import collections
import re

from ._control import strip_control
from ._redactor import Redactor
from ._rules import REDACTED, _replace_spans
from ._shared import _shared, redact

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
