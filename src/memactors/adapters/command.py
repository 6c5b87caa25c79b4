"""The ``command`` adapter: any program, from an argv template with ``{prompt}``.

``[harness.<name>] command`` is split like a shell would (``shlex``, no shell runs) and every
``{prompt}`` inside an element is replaced by the run's prompt; with no ``{prompt}`` anywhere and a
prompt to give, the prompt is the last argument, after ``extra_args``.
The program also finds the gateway in its environment: ``MEMACTORS_GATEWAY_URL``,
``MEMACTORS_RUN_TOKEN`` and ``MEMACTORS_MCP_CONFIG`` (set by the runs actor for every adapter).

Its output is free text, so the parser keeps only the tail of stdout (the last few thousand
characters) as the run's result text; the outcome comes from the exit status, and edits from git.
"""

from __future__ import annotations

import shlex
from collections import deque

import attrs

from ..errors import InvalidArgument
from . import LaunchRequest, LaunchSpec, Transcript

__all__ = ["CommandAdapter", "CommandParser"]

#: How much of the end of stdout becomes the result text.
TAIL_CHARS = 4000


@attrs.define
class CommandParser:
    """Keeps the last TAIL_CHARS characters of stdout, nothing else."""

    transcript: Transcript = attrs.field(factory=Transcript)
    _tail: deque[str] = attrs.field(factory=deque)
    _size: int = 0

    def feed(self, line: str, *, at: str) -> None:
        self._tail.append(line)
        self._size += len(line) + 1
        while self._size > TAIL_CHARS and len(self._tail) > 1:
            self._size -= len(self._tail.popleft()) + 1
        text = "\n".join(self._tail).strip()
        self.transcript.result_text = text[-TAIL_CHARS:] or None
        if line.strip():
            self.transcript.texts += 1
            self.transcript.last_text = line


@attrs.frozen
class CommandAdapter:
    name: str = "command"
    default_command: str = ""

    def launch(self, request: LaunchRequest) -> LaunchSpec:
        if not request.command or not request.command.strip():
            raise InvalidArgument(f"[harness.{request.harness}] command is required for the command adapter",
                                  field="command", harness=request.harness)
        try:
            template = shlex.split(request.command)
        except ValueError as exc:
            raise InvalidArgument(f"[harness.{request.harness}] command cannot be split: {exc}",
                                  field="command", harness=request.harness) from None
        prompt = request.prompt
        argv = [part.replace("{prompt}", prompt or "") for part in template]
        argv += request.extra_args
        if prompt is not None and not any("{prompt}" in part for part in template):
            argv.append(prompt)
        return LaunchSpec(argv=tuple(argv))

    def parser(self) -> CommandParser:
        return CommandParser()
