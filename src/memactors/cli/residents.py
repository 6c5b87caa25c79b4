"""``memactors hook gemini-cli|opencode|qwen-code …``: what a resident Gemini CLI, OpenCode or Qwen Code runs at a
session's start and end, as ``memactors install`` wrote it into the agent's configuration.
Qwen Code, a Gemini CLI fork, has Gemini's hooks; its session file is its chat recording
(``agents.resident_sessions.qwen_session``).

- ``hook gemini-cli session-start``: Gemini CLI's ``SessionStart`` hook. Its stdout, ``{"hookSpecificOutput":
  {"hookEventName": "SessionStart", "additionalContext": <fenced briefing>}}``, is what Gemini CLI puts
  before the session's first prompt (headless: prepended to the prompt, inside ``<hook_context>``).
- ``hook gemini-cli session-end``: Gemini CLI's ``SessionEnd`` hook; reads the session file its input names
  (``transcript_path``) into a run record (``agents.resident_sessions``).
- ``hook opencode session-start``: run by memactors' OpenCode plugin at a session's first model request, with
  ``{"source": "startup" | "resume"}`` on stdin; prints the same JSON, whose fenced briefing the plugin adds
  to the system prompt.
- ``hook opencode session-end``: run by the plugin when OpenCode exits, the session's parts on stdin.

The briefing comes from the gateway with the resident's own token, read from the file install wrote
(never from argv), by the same code as Claude Code's and Codex's session-start hooks (``_session_start.
brief_session``: REQ-15's tool semantics; the daemon down or slow gives nothing at once, counted for
doctor). The record goes the way theirs do (``agents.deliver_session``: the daemon, else the spool). Every
hook exits 0 on those paths: a session never waits or fails for memactors; stdout carries nothing but the
hook's JSON (Gemini CLI parses it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._core import load

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``hook <agent> session-start|session-end`` for every agent described with the ``gemini`` or
    ``opencode`` layout (``adapters.kinds``), and pi's hooks, to ``memactors hook`` (``cli.agents`` makes that
    group)."""
    from ..adapters.kinds import KINDS
    from ._session_start import add_session_start

    hook = sub.choices["hook"]
    [groups] = [a for a in hook._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {"gemini": ("SessionStart hook: this resident's briefing, fenced, as the session's additional context",
                        "SessionEnd hook: the session file (transcript_path) as a run record"),
             "opencode": ("run by memactors' plugin: print this resident's briefing, fenced",
                          "run by memactors' plugin at exit: the session's parts (stdin) as a run record")}
    for described in KINDS.values():
        if described.layout not in helps:
            continue
        start_help, end_help = helps[described.layout]
        agent = described.name
        events = groups.add_parser(agent, help=f"{described.title} hooks").add_subparsers(dest="hook_event",
                                                                                         required=True)
        add_session_start(events, cmd_session_start, help=start_help, agent=agent)
        p = events.add_parser("session-end", help=end_help)
        p.add_argument("--harness", help="the [harness.<name>] the session belongs to (default: $MEMACTORS_HARNESS)")
        p.set_defaults(fn=cmd_session_end, agent=agent)
    events = groups.add_parser("pi", help="pi hooks (run by memactors' pi extension)").add_subparsers(
        dest="hook_event", required=True)
    p = events.add_parser("session-end", help="run by memactors' pi extension when a session shuts down: its "
                                              "session file as a run record")
    p.add_argument("--harness", help="the [harness.<name>] the session belongs to (default: $MEMACTORS_HARNESS)")
    p.set_defaults(fn=cmd_session_end, agent="pi")
    p = events.add_parser("tool", help="run by memactors' pi extension: one memory tool call at the gateway "
                                       "(arguments as JSON on stdin), its text on stdout")
    p.add_argument("--harness", help="the [harness.<name>] the resident runs as (in a `memactors run`: the run's)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--project", metavar="DIR", help="installed with --project DIR")
    where.add_argument("--user", action="store_true", help="installed with --user")
    p.add_argument("tool", choices=("recall", "briefing"), help="the gateway tool")
    p.set_defaults(fn=cmd_pi_tool, agent="pi")


# -- session start -------------------------------------------------------------------------------------------

def _gateway(args: argparse.Namespace) -> tuple[str, str]:
    """(gateway URL, token) of the memactors server entry install wrote for this place."""
    from ..adapters.kinds import kind

    described = kind(args.agent)
    path = described.settings_file(Path(args.project) if args.project else None, os.environ)
    try:
        entry = json.loads(path.read_text(encoding="utf-8-sig"))[described.servers_key]["memactors"]
        url, header = entry.get("url") or entry["httpUrl"], entry["headers"]["Authorization"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"{path} has no memactors server (run `memactors install {args.agent}`)") from None
    return str(url), str(header).removeprefix("Bearer ").strip()


def cmd_session_start(args: argparse.Namespace) -> int:
    """The briefing as the hook's ``additionalContext``; on any failure nothing, exit 0, the failure counted."""
    from ._session_start import brief_session

    return brief_session(args, _gateway)


def pi_gateway_file(state_dir: Path, project: Path | None) -> Path:
    """Where install keeps a pi resident's gateway URL and token (mode 0600, in the private ``installs/``):
    pi has no configuration of its own for an MCP server to hold them."""
    from .install import run_id_for

    return Path(state_dir) / "installs" / f"{run_id_for('pi', project)}.pi-gateway.json"


def cmd_pi_tool(args: argparse.Namespace) -> int:
    """One ``recall`` or ``briefing`` call at the gateway for pi's extension: the arguments on stdin, the tool's
    text on stdout. Inside a ``memactors run`` the run's own gateway and token (its environment); otherwise
    the resident's, from the file install wrote. Exit 1 with the reason on stderr when the call failed."""
    from ..agents.session_start import BriefingUnavailable, call_tool
    from ._core import config_for
    from .agents import hook_input

    arguments = hook_input()
    url, token = os.environ.get("MEMACTORS_GATEWAY_URL"), os.environ.get("MEMACTORS_RUN_TOKEN")
    if not (url and token):
        path = pi_gateway_file(config_for(args, "read").store.path,
                               Path(args.project).resolve() if args.project else None)
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            url, token = str(found["url"]), str(found["token"])
        except (OSError, ValueError, KeyError, TypeError):
            print(f"memactors: {path} has no gateway (run `memactors install pi`)", file=sys.stderr)
            return 1
    try:
        text = call_tool(url, token, args.tool, arguments, timeout=20.0)
    except BriefingUnavailable as exc:
        print(f"memactors: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


# -- session end ---------------------------------------------------------------------------------------------

def _record(args: argparse.Namespace, harness: str, hook: dict[str, Any], *, detach: bool = False
            ) -> dict[str, Any] | None:
    """The session's run record. With ``detach`` (an agent that gives its exit hooks seconds: ``kinds.
    AgentKind.exit_grace``), the input and the session file are checked here (a bad one still fails
    visibly) and the rest, the slow part (the reader, the configuration, the store's modules), is done by a
    detached child: None in the parent."""
    from ..adapters.kinds import kind
    from ..errors import InvalidArgument
    from ._hook_io import open_transcript

    described = kind(args.agent)
    if described.session_reader:
        field = described.session_field
        # Gemini CLI's and Qwen Code's hook input names the session; pi's extension names only its file.
        required = (field,) if field == "session_file" else ("session_id", field)
        for name in required:
            if not isinstance(hook.get(name), str) or not hook[name]:
                whose = "the extension's" if field == "session_file" else "the hook"
                raise InvalidArgument(f"{whose} input has no {name}", field=name)
        with open_transcript(hook[field], field=field) as lines:
            if detach and _detached():
                return None  # the parent: the agent may exit now; the detached child delivers the record
            session = _reader(described.session_reader)(lines)
        transcript, started, ended = session.transcript, session.started_at, session.ended_at
        session_id = str(hook.get("session_id") or transcript.session_id or Path(hook[field]).stem)
        cwd = str(hook.get("cwd") or os.getcwd())
    else:
        from ..agents.resident_sessions import opencode_session

        if not isinstance(hook.get("session_id"), str) or not hook["session_id"]:
            raise InvalidArgument("the plugin's input has no session_id", field="session_id")
        transcript, started, ended = opencode_session(hook)
        session_id, cwd = hook["session_id"], str(hook.get("directory") or os.getcwd())
    from ..agents.resident_sessions import resident_record
    from ..store import iso
    from .agents import harness_config

    cfg = harness_config(load(args), harness)
    now = iso(datetime.now(UTC))
    return resident_record(transcript, harness=harness, adapter=args.agent, cfg=cfg, session_id=session_id,
                           cwd=cwd, started_at=started or now, ended_at=ended or now)


def _reader(target: str) -> Any:
    """The session reader ``module:function`` an agent's description names."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def cmd_session_end(args: argparse.Namespace) -> int:
    """The session's run record → IngestRun; spooled when no daemon answers. Nothing on stdout."""
    from ..adapters.kinds import kind
    from .agents import deliver_session, hook_input, session_end_harness

    harness = session_end_harness(args)
    if harness is None:
        return 0
    record = _record(args, harness, hook_input(), detach=kind(args.agent).exit_grace)
    if record is None:
        return 0
    return deliver_session(args, record, f"{args.agent} session-end {record['run_id']}", out=sys.stderr)


def _detached() -> bool:
    """Qwen Code gives each exit cleanup, its SessionEnd hook among them, 2 s and then exits, killing the
    hook's process group: past the checks of its input, the record is made and delivered (or spooled) by a
    child in a session of its own, which outlives Qwen Code (on a loaded machine the configuration and the
    store's modules alone can take those 2 s). True in the parent, which returns at once; False in
    the child (and where fork fails: then the record is delivered by this process, as for the other
    agents)."""
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid:
        return True
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # Qwen Code's pipes close when it exits: nothing may be written to them
    return False
