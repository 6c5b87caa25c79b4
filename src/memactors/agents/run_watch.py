"""What an operator can watch of a run while it runs: its parsed events and its stderr tail.

The runs actor feeds every stdout line to the adapter's parser (``adapters``) and then asks a
:class:`RunWatch` what the line changed in the :class:`~memactors.adapters.Transcript`; each change
becomes one **event** (``memactors runs logs``): the agent's session, a tool it called, a file it
edited, a shell command with its exit status, its free text, its result with cost and turns, and the
daemon's own notes (a cap reached, a cancel asked for). Events are derived from the transcript, not
from the raw stream, so every adapter has them without code of its own, and nothing the parser does
not keep (tool output, thinking, the prompt) can appear.

Bounds (docs/runs.md "What is kept"): every string in an event is redacted with the shared redactor
and cut to :data:`MAX_EVENT_CHARS`; a run keeps its last :data:`MAX_EVENTS` events (older ones are
counted as ``dropped``). The agent's stderr is never parsed: its last :data:`STDERR_TAIL_BYTES` bytes
are kept (:class:`StderrTail`) and redacted when the run ends (``redact.redact_tail``: a key block that
the window cut is still caught), so a launch failure or a refusal says why (issue 18). Neither goes into the episode (REQ-5): they are kept with the run only.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import trio

from ..adapters import Transcript
from ..redact import redact

__all__ = ["MAX_EVENTS", "MAX_EVENT_CHARS", "STDERR_TAIL_BYTES", "PromptScrub", "RunWatch", "StderrTail", "scrub"]

#: The events a run keeps (the newest); older ones are dropped and counted.
MAX_EVENTS = 500
#: Every string in an event is cut to this many characters (after redaction).
MAX_EVENT_CHARS = 500
#: The agent's stderr kept with the run: its last 4 KiB.
STDERR_TAIL_BYTES = 4096


def _cut(text: str) -> str:
    # Cut before redacting too (a 100 KB stdout line is not redacted whole on the loop), with room to
    # spare so a secret that straddles the first cut lies past the second one.
    text = redact(text[:4 * MAX_EVENT_CHARS])
    return text if len(text) <= MAX_EVENT_CHARS else f"{text[:MAX_EVENT_CHARS - 1]}…"


class StderrTail:
    """The last STDERR_TAIL_BYTES bytes a process wrote; nothing older is held."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._buffer += data
        if len(self._buffer) > STDERR_TAIL_BYTES:
            del self._buffer[:len(self._buffer) - STDERR_TAIL_BYTES]

    def text(self) -> str | None:
        """The tail as text, unredacted; None when empty. When older output was cut, the first (partial)
        line goes too: half a line is half a secret or half a prompt line, which redaction and
        ``scrub`` could not recognise."""
        data = bytes(self._buffer)
        if self.total > STDERR_TAIL_BYTES:
            newline = data.find(b"\n")
            data = data[newline + 1:] if newline >= 0 else b""
        if not data.strip():
            return None
        return data.decode("utf-8", "replace")


def scrub(text: str, prompt: str | None) -> str:
    """``text`` with every line of the composed prompt that occurs in it replaced by ``[prompt]``.

    An agent CLI that echoes its arguments in an error (a usage line) would otherwise put the briefing,
    its fence's nonce or the operator's prompt into what the daemon keeps; REQ-16 keeps the composed
    prompt out of every store and log. Lines shorter than 12 characters are left alone (they say too
    little to leak, and would scrub ordinary words).
    """
    if not prompt:
        return text
    if prompt in text:
        text = text.replace(prompt, "[prompt]")
    for line in sorted({ln.strip() for ln in prompt.splitlines()}, key=len, reverse=True):
        if len(line) >= 12 and line in text:
            text = text.replace(line, "[prompt]")
    return text


_NONCE = re.compile(r'nonce="([^"]+)"')


class PromptScrub:
    """The composed prompt's fingerprints, to keep them out of a run's events (REQ-16).

    An agent may echo its prompt on stdout (a ``command`` agent printing its argument), and each stdout
    line of such an agent is an event. Cheap enough for every event on the loop: an event line that is
    a line of the prompt (12 characters or more) becomes ``[prompt]``, and the fence's nonce is replaced
    wherever it occurs, so neither the briefing's lines nor the nonce reach the store. (The stderr tail,
    scrubbed once off the loop, gets the thorough ``scrub``.)"""

    def __init__(self, prompt: str | None) -> None:
        self.prompt = prompt or None
        self._lines = frozenset(ln.strip() for ln in (prompt or "").splitlines() if len(ln.strip()) >= 12)
        self._nonces = tuple(sorted(set(_NONCE.findall(prompt or ""))))

    def __call__(self, text: str) -> str:
        if self.prompt is None:
            return text
        if self._lines:
            text = "\n".join("[prompt]" if ln.strip() in self._lines else ln for ln in text.split("\n"))
        for nonce in self._nonces:
            text = text.replace(nonce, "[nonce]")
        return text


class RunWatch:
    """The events of one run, derived from its transcript as lines arrive; waited on by ``runs logs``."""

    def __init__(self, prompt: str | None = None) -> None:
        self._scrub = PromptScrub(prompt)
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.seq = 0
        self.stderr = StderrTail()
        #: Non-blank stdout lines the agent wrote (none: the run produced no output, ``launch_failed``).
        self.lines = 0
        self._changed = trio.Event()
        self.closed = False
        self._session = False
        self._tools = self._edits = self._commands = self._texts = 0
        self._result: tuple[Any, ...] = (None, None, None)

    @property
    def dropped(self) -> int:
        """Events no longer kept (the run had more than MAX_EVENTS)."""
        return self.seq - len(self.events)

    def note(self, kind: str, at: str, **fields: Any) -> None:
        """Add one event; string fields are redacted and cut."""
        self.seq += 1
        event = {"seq": self.seq, "at": at, "kind": kind}
        event.update({k: _cut(self._scrub(v)) if isinstance(v, str) else v for k, v in fields.items()})
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    def after_line(self, line: str, t: Transcript, at: str) -> None:
        """A stdout line was fed to the parser: add an event for each thing it changed in ``t``."""
        if line.strip():
            self.lines += 1
        if not self._session and t.session_id:
            self._session = True
            self.note("session", at, session_id=t.session_id, model=t.model)
        for name in t.tool_calls[self._tools:]:
            self.note("tool", at, name=name)
        self._tools = len(t.tool_calls)
        for edit in t.edits[self._edits:]:
            self.note("edit", at, path=edit.path)
        self._edits = len(t.edits)
        for command in t.commands[self._commands:]:
            self.note("command", at, command=command.command, exit_code=command.exit_code)
        self._commands = len(t.commands)
        if t.texts > self._texts and t.last_text:
            self.note("text", at, text=t.last_text)
        self._texts = t.texts
        result = (t.result_ok, t.result_kind, t.cost_usd)
        if t.result_ok is not None and result != self._result:
            self.note("result", at, ok=t.result_ok, subtype=t.result_kind, cost_usd=t.cost_usd, turns=t.turns)
        self._result = result

    def since(self, after: int) -> list[dict[str, Any]]:
        """The kept events with a sequence number above ``after``, oldest first."""
        return [e for e in self.events if e["seq"] > after]

    async def wait_after(self, after: int) -> None:
        """Return once there is an event above ``after`` (at once if there is one already) or the run
        has ended."""
        while self.seq <= after and not self.closed:
            await self._changed.wait()

    def close(self) -> None:
        """The run ended: wake every follower (they see the run's state and stop)."""
        self.closed = True
        self._changed.set()
