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
the window cut is still caught), so a launch failure or a refusal says why. Neither goes into the
episode (REQ-5): they are kept with the run only.

What the agent echoes of its prompt is scrubbed (:class:`PromptScrub`): the operator's prompt and the
fence nonces, never the briefing's items, so an answer that repeats a briefing line is kept.
Every text is redacted first and scrubbed after: a scrub inside a credential would split it
into halves the redactor no longer recognises.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import ahocorasick_rs
import trio

from ..adapters import Transcript
from ..documents import NONCE_BYTES
from ..redact import redact, redact_many

__all__ = ["MAX_EVENTS", "MAX_EVENT_CHARS", "STDERR_TAIL_BYTES", "MIN_LINE", "PromptScrub", "RunWatch", "StderrTail", "scrub"]

#: The events a run keeps (the newest); older ones are dropped and counted.
MAX_EVENTS = 500
#: Every string in an event is cut to this many characters (after redaction).
MAX_EVENT_CHARS = 500
#: The agent's stderr kept with the run: its last 4 KiB.
STDERR_TAIL_BYTES = 4096


def _cut(text: str, scrub: PromptScrub | None = None) -> str:
    """``text`` redacted, then scrubbed of the operator's prompt (``scrub``), then cut to MAX_EVENT_CHARS.

    Redaction comes first: a scrub that replaced part of a credential would split it, and the
    redactor would pass both halves. The text is cut before redacting too (a 100 KB stdout line is not
    redacted whole on the loop), with room to spare so a secret that straddles the first cut lies past
    the second one; a line that the first cut halves and that begins a line of the prompt is dropped.
    """
    window = text[:4 * MAX_EVENT_CHARS]
    if scrub is not None and len(window) < len(text):
        window = scrub.cut_line(window)
    text = redact(window)
    if scrub is not None:
        text = scrub(text)
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


def scrub(text: str, prompt: str | None, composed: str | None = None) -> str:
    """``text`` (already redacted) without the operator's ``prompt`` or the fence nonces of ``composed``
    (the prompt the agent received): :meth:`PromptScrub.thorough`."""
    return PromptScrub(prompt, composed).thorough(text)


#: A prompt line shorter than this is left alone: it says too little to leak, and would scrub ordinary words.
MIN_LINE = 12
PROMPT = "[prompt]"
NONCE = "[nonce]"
#: Scrub passes at most: each one replaces what the last one joined (a pattern across a marker's edge).
_MAX_PASSES = 8
# The opening line of an untrusted-data fence (prompt.fence): the briefing's, or an event field's that
# an ``untrusted_inline`` template put in the operator's prompt.
# A nonce as wrapper.new_nonce makes them (hex), in a tag of the briefing document.
_WRAPPER_NONCE = re.compile(rf'nonce="([0-9a-f]{{{2 * NONCE_BYTES}}})"')
_FENCE_OPEN = re.compile(r'^<untrusted-data source="[^"]*" field="[^"]*" nonce="([^"]+)">$', re.MULTILINE)


class PromptScrub:
    """What of a run's prompt may not be kept (REQ-5, REQ-16): the **operator's prompt** and the fence
    **nonces**, nothing else.

    ``prompt`` is the operator's prompt (after ``prompt_file`` is read and a template rendered);
    ``composed`` what the agent received, the fenced briefing before it (``prompt.compose_prompt``).
    The briefing is not the prompt: its items are episodes and facts already stored, redacted, and an
    answer that repeats one ("No new issues.", an earlier run's excerpt) is what the agent said, kept
    verbatim. So only whole lines of the operator's prompt (12 characters or more, stripped;
    as written and as the redactor renders them, since the text scrubbed is redacted first) become
    ``[prompt]`` wherever they occur (a usage line that echoes the argument), the whole composed prompt
    too when it is echoed whole, and each fence nonce ``[nonce]``.

    One Aho-Corasick automaton (leftmost longest: a line that contains another goes whole) is built per
    run (off the loop: ~0.2 s for a 100 KiB prompt), so scrubbing an event on the loop costs one pass over
    its text whatever the prompt's size."""

    def __init__(self, prompt: str | None, composed: str | None = None) -> None:
        self.prompt = prompt or None
        composed = (composed or None) if composed is not None else self.prompt
        raw = {ln.strip() for ln in (prompt or "").splitlines()}
        raw = {ln for ln in raw if len(ln) >= MIN_LINE}
        self._raw = frozenset(raw)
        shown = {ln.strip() for ln in redact_many(sorted(raw))} if raw else set()
        lines = raw | {ln for ln in shown if len(ln) >= MIN_LINE}
        wholes = {w for w in (composed, self.prompt) if w and len(w.strip()) >= MIN_LINE}
        wholes |= {redact(w) for w in wholes}
        # The whole prompt by str.replace, longest first, not in the automaton: a 100 KiB pattern makes
        # it slow to build, and a whole echo is rare and cheap to look for.
        self._wholes = tuple(sorted(wholes - lines, key=lambda w: (-len(w), w)))
        nonces = set(_FENCE_OPEN.findall(prompt or ""))
        if composed and composed != self.prompt and (first := _FENCE_OPEN.match(composed)):
            nonces.add(first.group(1))  # the briefing's fence: the first line of a composed prompt
            # and the nonces of the briefing document's own fences (`<memory-data … nonce="…">`)
            nonces.update(_WRAPPER_NONCE.findall(composed[:len(composed) - len(self.prompt or "")]))
        # A pattern inside a marker would match its own replacement forever (never a real nonce: 16 hex).
        patterns = {p: PROMPT for p in lines} | {n: NONCE for n in nonces}
        patterns = {p: m for p, m in patterns.items() if p and p not in PROMPT + NONCE}
        self._patterns = sorted(patterns)
        self._markers = [patterns[p] for p in self._patterns]
        self._automaton = None if not self._patterns else ahocorasick_rs.AhoCorasick(
            self._patterns, matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST)

    def __call__(self, text: str) -> str:
        """``text`` (redacted) with every line of the operator's prompt and every nonce replaced, until
        none is left (a replacement can join two halves of another)."""
        for whole in self._wholes:
            if whole in text:
                text = text.replace(whole, PROMPT)
        if self._automaton is None:
            return text
        for _ in range(_MAX_PASSES):
            matches = self._automaton.find_matches_as_indexes(text, overlapping=False)
            if not matches:
                break
            parts, at = [], 0
            for index, start, end in matches:
                parts += [text[at:start], self._markers[index]]
                at = end
            text = "".join(parts) + text[at:]
        return text

    thorough = __call__

    def cut_line(self, window: str) -> str:
        """``window``, the start of a longer text, without its last line when that line (which the window
        cut) may be the start of a line of the prompt: it is ``[prompt]`` then."""
        head, sep, last = window.rpartition("\n")
        last = last.strip()
        if len(last) >= MIN_LINE and any(line.startswith(last) for line in self._raw):
            return head + sep + PROMPT
        return window


class RunWatch:
    """The events of one run, derived from its transcript as lines arrive; waited on by ``runs logs``."""

    def __init__(self, prompt: str | None = None, composed: str | None = None, *,
                 scrub: PromptScrub | None = None) -> None:
        #: The operator's prompt and the fence nonces, kept out of everything the run keeps (built by the
        #: caller off the loop for a run: ``scrub``).
        self.scrub = scrub if scrub is not None else PromptScrub(prompt, composed)
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
        event.update({k: _cut(v, self.scrub) if isinstance(v, str) else v for k, v in fields.items()})
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
