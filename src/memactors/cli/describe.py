"""`memactors describe <harness> [--json]`: a harness as configured, with its prompt source verbatim
(SPEC-0030 REQ-20: the prompt source stays stored verbatim).

The briefing a `memory_briefing = true` one-shot gets is prepended inside the daemon at spawn and never
stored, logged or sent (REQ-16): `describe` shows the operator's prompt exactly as configured and never
a briefing (`memory briefing <harness>` previews that).
"""

from __future__ import annotations

import argparse
from typing import Any

from . import _core as core
from ._core import JSON_HELP, CliError, call

#: The prompt keys of a `[harness.*]` table (REQ-16's four prompt sources).
PROMPT_KEYS = ("prompt", "prompt_file", "prompt_template", "prompt_template_file")


def cmd_describe(args: argparse.Namespace) -> int:
    try:
        result = call(args, "DescribeHarness", {"harness": args.harness})
    except CliError as exc:
        if exc.code == "INVALID_ARGUMENT" and "params.harness names no configured" in exc.message:
            raise CliError(exc.code, f"{args.harness} is not a configured harness: add a [harness.{args.harness}] "
                                     "table to the global harness.toml") from None
        raise
    if args.json:
        core.print_json(result)
        return 0
    rows = [("harness", result["harness"]), ("adapter", result["adapter"]),
            ("workdir", result.get("workdir") or "-"),
            ("memory_briefing", "true" if result["memory_briefing"] else "false"),
            ("prompt source", result.get("prompt_source") or "none (not a prompt one-shot)")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    source = result.get("prompt_source")
    if source:
        # Verbatim: the text (or path) as configured, nothing added before or after it.
        print(f"\n{source}:")
        print(result[source])
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "describe", help="a configured harness and its prompt source, verbatim (never the briefing)",
        description="Show [harness.<name>] as the daemon has it configured: adapter, workdir, memory_briefing "
                    "and the prompt source (prompt, prompt_file, prompt_template or prompt_template_file) "
                    "exactly as configured. The briefing a memory_briefing one-shot receives is prepended at "
                    "spawn and never stored; preview it with `memactors memory briefing <harness>`.")
    p.add_argument("harness", help="a configured [harness.<name>]")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_describe)
