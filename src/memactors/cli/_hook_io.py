"""What a hook reads from its agent, read one safe way: the hook input on stdin and the session file it names.

A hook runs inside the user's agent (Claude Code, Codex, Gemini CLI, OpenCode), which waits for it: whatever
the agent — or anything that can write a hook's stdin or a transcript path — gives it, the hook must end soon
and quietly. So every hook reads through here:

- stdin: at most :data:`STDIN_BYTES`, within :data:`STDIN_SECONDS` (an agent that never closes the pipe, or
  ``/dev/zero``, does not hold the hook); bytes decoded as UTF-8 with invalid sequences replaced; JSON nested
  at most :data:`MAX_DEPTH` deep (no RecursionError later); lone surrogates and NULs in strings replaced
  (they cannot be encoded on the wire, and a NUL cannot be in a path).
- the transcript: opened without blocking and read only when it is a regular file (a FIFO, a device such as
  ``/dev/zero``, a directory are refused by name), at most :data:`TRANSCRIPT_BYTES`, within
  :data:`TRANSCRIPT_SECONDS`.

What is refused is an ``InvalidArgument`` naming the field (exit 5, one line), never a traceback or a hang.
Standard library only: a hook's start-up is part of every session's start and end.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import stat
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_DEPTH", "STDIN_BYTES", "STDIN_SECONDS", "TRANSCRIPT_BYTES", "TRANSCRIPT_SECONDS", "clean",
           "open_transcript", "read_stdin_json"]

#: The most a hook reads from stdin (OpenCode's session-end sends the session's parts there).
STDIN_BYTES = 64 * 1024 * 1024
#: How long a hook waits for its agent to finish writing stdin (they write and close at once).
STDIN_SECONDS = 5.0
#: The largest transcript or rollout a hook reads (a long Claude Code session is a few tens of MB).
TRANSCRIPT_BYTES = 256 * 1024 * 1024
#: How long a hook may spend reading the transcript.
TRANSCRIPT_SECONDS = 20.0
#: The deepest nesting a hook input may have (real ones are under 20 deep).
MAX_DEPTH = 100
#: A single transcript line longer than this is cut (the reader skips it as not JSON).
_LINE_BYTES = 64 * 1024 * 1024


def _invalid(message: str, field: str) -> Exception:
    from ..errors import InvalidArgument

    return InvalidArgument(message, field=field)


def _read_stdin_bytes(limit: int, seconds: float) -> bytes:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return b""  # no stdin at all: an empty input
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _invalid(f"the hook input on stdin did not end within {seconds:g} s", "stdin")
        try:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
        except OSError as exc:
            raise _invalid(f"cannot read the hook input on stdin: {exc.strerror or exc}", "stdin") from None
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise _invalid(f"the hook input on stdin is over {limit} bytes", "stdin")
        chunks.append(chunk)


def clean(value: Any, depth: int = 0) -> Any:
    """``value`` (parsed JSON) with lone surrogates and NULs in its strings replaced by U+FFFD; InvalidArgument
    when it is nested deeper than :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        raise _invalid(f"the hook input is nested deeper than {MAX_DEPTH} levels", "stdin")
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
        return value
    if isinstance(value, dict):
        return {clean(k, depth + 1): clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, depth + 1) for v in value]
    return value


def read_stdin_json(*, empty: Any = None) -> Any:
    """The hook input on stdin, parsed and :func:`clean` (``empty`` when stdin is empty); InvalidArgument
    naming stdin when it is too large, too slow, not JSON or nested too deep."""
    data = _read_stdin_bytes(STDIN_BYTES, STDIN_SECONDS)
    if not data.strip():
        return empty
    text = data.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        message = getattr(exc, "msg", str(exc))
        where = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _invalid(f"the hook input on stdin is not JSON ({message}{where})", "stdin") from None
    except RecursionError:
        raise _invalid(f"the hook input is nested deeper than {MAX_DEPTH} levels", "stdin") from None
    return clean(parsed)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _lines(f: Any, field: str, deadline: float) -> Iterator[str]:
    total = 0
    while True:
        if time.monotonic() > deadline:
            raise _invalid(f"reading {field} took longer than {TRANSCRIPT_SECONDS:g} s", field)
        line = f.readline(_LINE_BYTES)
        if not line:
            return
        total += len(line)
        if total > TRANSCRIPT_BYTES:
            raise _invalid(f"{field} grew past {TRANSCRIPT_BYTES} bytes while it was read", field)
        yield line.decode("utf-8", "replace")


@contextlib.contextmanager
def open_transcript(path: str | os.PathLike[str], field: str = "transcript_path") -> Iterator[Iterator[str]]:
    """The session file ``path`` as text lines, when it is a regular file of at most :data:`TRANSCRIPT_BYTES`
    read within :data:`TRANSCRIPT_SECONDS`; else InvalidArgument naming ``field`` and what it is. A reader
    that recurses too deep on a line, or meets an unencodable string, is refused the same way."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _invalid(f"cannot read {field} {os.fsdecode(path)!r}: {exc.strerror or exc}", field) from None
    except ValueError:  # a NUL in the path
        raise _invalid(f"{field} is not a usable path", field) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _invalid(f"{field} {os.fsdecode(path)!r} is {_kind(info.st_mode)}, not a session file", field)
        if info.st_size > TRANSCRIPT_BYTES:
            raise _invalid(f"{field} is {info.st_size} bytes, over the hook's limit of {TRANSCRIPT_BYTES}", field)
        os.set_blocking(fd, True)
    except BaseException:  # ok: closes the descriptor and re-raises, cancellation included
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            yield _lines(f, field, time.monotonic() + TRANSCRIPT_SECONDS)
        except RecursionError:
            raise _invalid(f"{field} has a line nested too deep to read", field) from None
        except OSError as exc:
            raise _invalid(f"cannot read {field}: {exc.strerror or exc}", field) from None
