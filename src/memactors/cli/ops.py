"""Commands about the daemon itself: `serve`, `doctor`, `tui`, `completion`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import _core as core
from ._core import JSON_HELP, CliError, call


def cmd_serve(args: argparse.Namespace) -> int:
    from .._hangup import early_reload, keep_early_hangups

    # Already in place when the process's command line is `serve` (the top of `memactors.cli`); here for
    # a caller of `main(["serve"])`. Before the daemon's (heavy) imports either way: from here a SIGHUP
    # is noted as a reload to apply once the daemon serves.
    keep_early_hangups()

    from ..daemon import serve_main

    return serve_main(Path(args.config) if args.config else None, early_reload=early_reload)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import Row, format_rows

    try:
        result = call(args, "Doctor", {})
    except CliError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        result = {"ok": False, "rows": [{"status": "fail", "name": "daemon", "message": exc.message}]}
    if args.json:
        core.print_json(result)
    else:
        print(format_rows([Row(**r) for r in result["rows"]]))
    return 0 if result["ok"] else 1


def cmd_tui(args: argparse.Namespace) -> int:
    from ..tui import HarnessEntry, run_tui

    config = core.load(args)
    entries = [HarnessEntry(name, h.harness, h.memory_briefing) for name, h in sorted(config.harness.items())]
    run_tui(entries, core.operator_url(config), core.token_for(config, "read"))
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    if args.shell == "fish":  # shtab writes bash, zsh and tcsh only
        from ._fish import fish_script

        print(fish_script(args.root_parser), end="")
        return 0
    import shtab

    print(shtab.complete(args.root_parser, shell=args.shell))  # the whole parser (cli.build_parser)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="health rows for memory (exit 1 on any fail)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("tui", help="terminal UI: harnesses, recent episodes, provider state, briefing preview (B)")
    p.set_defaults(fn=cmd_tui)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)",
                       description="Print a completion script. bash: `memactors completion bash > "
                                   "~/.local/share/bash-completion/completions/memactors`; zsh: `memactors "
                                   "completion zsh > \"${fpath[1]}/_memactors\"`; fish: `memactors completion "
                                   "fish > ~/.config/fish/completions/memactors.fish`.")
    p.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell to complete in")
    p.set_defaults(fn=cmd_completion)
