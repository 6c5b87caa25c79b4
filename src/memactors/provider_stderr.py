"""A provider's stderr: logged redacted and rate-limited, and its last lines kept to say why it failed.

A stdio provider writes its tracebacks and warnings to stderr. The daemon never lets them through to
its own stderr (a provider's traceback can print a secret as it is): the provider session and
``provider check`` each hand the process a pipe and read it here, with :func:`log_stderr`, into the
daemon's log. ``provider check`` also keeps a :class:`StderrTail` and prints its last lines under a
failing check, so an operator sees the provider's own words (a ``ModuleNotFoundError``) where it
would otherwise see only "Connection closed". Both paths redact the same way, multi-line key blocks
included; neither is part of the session's connection logic, so they live apart from it.
"""

from __future__ import annotations

import collections
from typing import Any

import trio

from .redact import LineRedactor, redact
from .urls import mask_urls

#: A stdio provider's stderr: each line cut to this many characters, at most STDERR_LINES_PER_WINDOW
#: lines logged per STDERR_WINDOW seconds (the rest counted in one "suppressed" line).
STDERR_LINE_CHARS = 1000
STDERR_LINES_PER_WINDOW = 50
STDERR_WINDOW = 10.0
#: A StderrTail keeps this many lines (the window redacted as one text) and shows the last STDERR_TAIL_SHOW.
STDERR_TAIL_KEEP = 200
STDERR_TAIL_SHOW = 20


class StderrTail:
    """The last lines a provider wrote to stderr, kept in memory to show an operator why it failed
    (``memactors memory provider check``). Bounded (STDERR_TAIL_KEEP lines, each cut to
    STDERR_LINE_CHARS); :meth:`lines` redacts the kept window as one text, so a secret spread over
    several lines (a key block) is caught as a whole before anything leaves the daemon."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_KEEP)

    def add(self, line: str) -> None:
        self._lines.append(line[:STDERR_LINE_CHARS])

    def lines(self, count: int = STDERR_TAIL_SHOW) -> tuple[str, ...]:
        """The last ``count`` non-blank lines, redacted."""
        if not self._lines:
            return ()
        shown = [line for line in redact("\n".join(self._lines)).split("\n") if line.strip()]
        return tuple(shown[-count:])


async def log_stderr(read_fd: int, logger_: Any, tail: StderrTail | None = None) -> None:
    """Read a provider's stderr from `read_fd` (owned and closed here) until EOF or cancellation and log
    each line redacted, cut to STDERR_LINE_CHARS and rate-limited, tagged `source=provider_stderr`.

    Lines are redacted with the memory of the lines before them (``LineRedactor``): a private key
    printed over many lines is dropped whole, its body lines included, which redacting each line on
    its own let through. URLs are shown without their credentials. Every line (rate limit or
    not) also goes to ``tail`` when one is given, redacted the same way: a key block whose first line
    has left the tail's window is not shown either."""
    log = logger_.bind(source="provider_stderr")
    lines_redactor = LineRedactor()
    stream = trio.lowlevel.FdStream(read_fd)
    async with stream:
        buffer = b""
        window_end, logged, suppressed = 0.0, 0, 0
        ended = False
        while not ended:
            chunk = await stream.receive_some(65536)
            ended = not chunk
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > STDERR_LINE_CHARS * 4 or (ended and buffer):
                # a line that never ends is cut, not buffered; at EOF a last line without "\n" counts too
                lines.append(buffer)
                buffer = b""
            if not lines:
                continue
            # Redaction is CPU work (the whole rule set per line): a chunk's lines go through it in a
            # worker thread, so a provider printing megabytes at start never holds up the loop (the
            # daemon's handshakes waited 30 s behind it at load 15). One task feeds the redactor, in
            # order, so its memory of the lines before stays right.
            for text in await trio.to_thread.run_sync(_redact_lines, lines_redactor, lines):
                if tail is not None:
                    tail.add(text)
                now = trio.current_time()
                if now >= window_end:
                    if suppressed:
                        log.bind(suppressed=suppressed).warning("provider stderr lines suppressed")
                    window_end, logged, suppressed = now + STDERR_WINDOW, 0, 0
                if logged >= STDERR_LINES_PER_WINDOW:
                    suppressed += 1
                    continue
                logged += 1
                log.bind(line=text[:STDERR_LINE_CHARS], chars=len(text)).info("provider stderr")


def _redact_lines(redactor: LineRedactor, lines: list[bytes]) -> list[str]:
    """Each line redacted, then its URLs masked; lines the redactor drops (a key block's body) or that
    are blank are left out.

    Every line goes through the redactor, suppressed ones too: it must see a key's first line to drop
    the lines after it. The redactor goes first, so a credential that is a whole URL's userinfo (a
    Sidekiq gems URL: user and password are both the secret) is seen whole; then URLs are masked. A
    URL's user name may go with its password here: in a log, a false positive is cheaper than a leak
    (docs/redaction.md)."""
    out = []
    for raw in lines:
        text = redactor.line(raw.decode("utf-8", "replace").rstrip("\r"))
        if text is not None and text.strip():
            out.append(mask_urls(text))
    return out
