"""Harness adapters: how one kind of coding agent is run headless and how its output is read.

An adapter is pure and small (docs/runs.md, "Adapters"): it builds the argv and environment for a run, and
it parses the agent's JSON-lines stdout *as it streams* into a :class:`Transcript` — tool calls become
edit and verify observations, the final result event becomes outcome, text, model and cost. Adapters
never start processes, never touch the store and never see the run token's meaning; the ``runs`` actor
does all of that. So each adapter is tested on recorded streams without a process, and end to end
through ``memactors run`` with the real agent CLI.

Modules: ``claude_code`` (``claude -p --output-format stream-json --verbose … -- <prompt>``), ``codex``
(``codex exec --json …``), ``gemini_cli`` (``gemini --output-format stream-json … --prompt <prompt>``),
``opencode`` (``opencode run --format json … -- <prompt>``) and ``command`` (a generic argv template with
``{prompt}``). A new agent is a
module here and its description in ``kinds.KINDS`` (which ``ADAPTERS`` and ``ADAPTER_CAPS`` below are read
from). May import: ``memactors.errors`` only
(config reads ``ADAPTER_CAPS``, so this package sits with the pure modules); adapters never import each
other.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from ..errors import InvalidArgument
from .kinds import KINDS

__all__ = [
    "ADAPTERS",
    "ADAPTER_CAPS",
    "Adapter",
    "CommandRun",
    "FileEdit",
    "LaunchRequest",
    "LaunchSpec",
    "StreamParser",
    "Transcript",
    "get_adapter",
    "json_object",
]


@attrs.frozen
class LaunchRequest:
    """What the runs actor knows when it asks an adapter for a command line.

    ``prompt`` is the composed prompt (briefing fence + operator prompt, REQ-16) or None for a run
    with no prompt. It is handed to the adapter only to place it in argv; an adapter never logs or
    stores it. ``mcp_config_path`` is a JSON file (Claude Code's ``--mcp-config`` format) naming the
    gateway with this run's bearer token; ``gateway_url`` and ``run_token`` are the same facts for
    adapters that take them from the environment.
    """

    harness: str
    run_id: str
    workdir: str
    prompt: str | None
    command: str | None          # [harness.<name>] command: the agent binary or argv template
    model: str | None = None
    allowed_tools: tuple[str, ...] = ()
    permission_mode: str | None = None
    extra_args: tuple[str, ...] = ()
    mcp_config_path: str | None = None
    gateway_url: str | None = None
    run_token: str | None = None
    #: The harness's caps (``max_turns``, ``max_cost_usd``), for an adapter whose CLI takes them as flags;
    #: the runs actor also enforces them on what the stream reports (ADAPTER_CAPS says which adapters can).
    max_turns: int | None = None
    max_cost_usd: float | None = None


@attrs.frozen
class LaunchSpec:
    """The process to start: argv (argv[0] resolved on PATH by the runs actor) and extra environment.

    ``stdin``: text the runs actor writes to the agent's stdin, which it then closes (the prompt, for a CLI
    that would alter it as an argument); None: stdin is ``/dev/null``."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = attrs.field(factory=dict)
    stdin: str | None = None


@attrs.frozen
class FileEdit:
    """The agent wrote ``path`` (absolute or relative to the run's cwd) at ``at`` (RFC 3339 UTC)."""

    path: str
    at: str


@attrs.frozen
class CommandRun:
    """The agent ran a shell command; ``exit_code`` None when it is not known.

    ``finished`` False: the agent CLI ran the command but reported no end for it, or an end without an
    exit status (Codex never sent its ``item.completed``; Claude Code's Bash timed out or was
    interrupted). A command the CLI refused to run has no exit status either but is ``finished``: it
    tested nothing. The run record turns an unfinished verify call into ``verify_incomplete``.
    """

    command: str
    exit_code: int | None
    at: str
    finished: bool = True


@attrs.define
class Transcript:
    """What a parser has read so far from one run's stream. Holds no raw stdout and no prompt."""

    session_id: str | None = None
    model: str | None = None
    cost_usd: float | None = None
    result_text: str | None = None
    #: The agent's own verdict from its final event: True ok, False error, None no final event seen.
    result_ok: bool | None = None
    #: The agent's own result subtype / failure reason (e.g. "success", "error_max_turns"), for the reason field.
    result_kind: str | None = None
    duration_ms: int | None = None
    #: Model turns seen so far (one per assistant message; a parser that cannot tell leaves it 0).
    turns: int = 0
    #: How many free-text messages the agent wrote, and the latest (an assistant text, or for the
    #: ``command`` adapter a stdout line): what ``memactors runs logs`` shows as the agent's words.
    texts: int = 0
    last_text: str | None = None
    edits: list[FileEdit] = attrs.field(factory=list)
    commands: list[CommandRun] = attrs.field(factory=list)
    tool_calls: list[str] = attrs.field(factory=list)   # tool names only, in order (never arguments)
    #: Commands started whose end the stream has not reported (yet): the CLI's item/tool id ->
    #: (how many ``commands`` had ended when it started, the command with ``finished`` False). A parser
    #: moves one into ``commands`` when its end arrives; what is left at the end of the run never finished.
    running: dict[str, tuple[int, CommandRun]] = attrs.field(factory=dict)


class StreamParser(Protocol):
    """Fed one stdout line at a time (already decoded, without the newline); never raises on bad input."""

    transcript: Transcript

    def feed(self, line: str, *, at: str) -> None: ...


def json_object(value: object) -> Mapping[str, object]:
    """``value`` if it is a JSON object, else an empty one: a missing or mistyped field of a stream event
    reads as an object with no fields, and each field is type-checked where it is read."""
    return value if isinstance(value, dict) else {}


class JsonLinesParser:
    """A StreamParser over a CLI's one-JSON-object-per-line stream: counts the lines, and those it could
    not use (not a JSON object, or a field of an unexpected type: the line is skipped, the run kept);
    a subclass reads each event in ``_event``."""

    transcript: Transcript

    def __init__(self) -> None:
        self.lines = 0
        self.unparsed = 0

    def feed(self, line: str, *, at: str) -> None:
        self.lines += 1
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            self.unparsed += 1
            return
        try:
            self._event(event, at)
        except (TypeError, ValueError, AttributeError):
            self.unparsed += 1

    def _event(self, event: dict[str, Any], at: str) -> None:
        raise NotImplementedError


class Adapter(Protocol):
    """One agent kind. ``name`` is the ``[harness.<name>] harness`` value that selects it."""

    name: str
    default_command: str

    def launch(self, request: LaunchRequest) -> LaunchSpec: ...

    def parser(self) -> StreamParser: ...



#: The registry: ``[harness.<name>] harness`` value -> "module:class" of its adapter (built with no
#: arguments): ``command`` and every agent of ``kinds.KINDS``. A module that is not installed makes its
#: adapter unknown, with an error naming it.
ADAPTERS: Mapping[str, str] = {"command": "memactors.adapters.command:CommandAdapter",
                               **{k.name: k.adapter for k in KINDS.values()}}


#: The per-harness caps each adapter can enforce (config load refuses a cap on any other: it would
#: silently do nothing). ``claude-code`` passes ``--max-turns`` and ``--max-budget-usd`` to the CLI, and
#: its stream reports turns and cost, on which the runs actor stops a run that passes a cap anyway.
#: ``codex exec`` takes neither limit and reports no cost; ``command`` has no structured stream.
ADAPTER_CAPS: Mapping[str, frozenset[str]] = {"command": frozenset(), **{k.name: k.caps for k in KINDS.values()}}


def get_adapter(name: str) -> Adapter:
    """The adapter registered as ``name``; InvalidArgument naming it and the known ones otherwise."""
    target = ADAPTERS.get(name)
    known = ", ".join(sorted(ADAPTERS))
    if target is None:
        raise InvalidArgument(f"harness = {name!r}: no adapter of that name (known: {known})", field="harness")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        raise InvalidArgument(f"harness = {name!r}: adapter module {module_name} is not installed",
                              field="harness") from None
    adapter: Adapter = getattr(module, attr)()
    return adapter
