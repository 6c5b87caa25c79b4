"""`memactors demo`: the five minutes of the README for someone who installed the wheel and has no
clone. The example run records ship as package data (`memactors/examples/`, the repository's
`examples/`); `demo` sends them to the running daemon through `runs ingest` (the same path, the same
summary and exit status) and prints what to try next with them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: The repository two of the example records are in.
DEMO_REPO = "forge.example/acme/api"
#: Run 42 (its flaky ledger test, "pinning the clock", "fails intermittently") asked for in words none of the
#: examples has: found by the embedded model's meaning alone (tests/project/test_packaging.py asks it).
OTHER_WORDS = "freezing time did not cure sporadic breakage"


def examples_dir() -> Path:
    """Where the installed package keeps the example run records and configuration."""
    from importlib import resources

    return Path(str(resources.files("memactors") / "examples"))


def next_steps(repo: str = DEMO_REPO) -> str:
    return "\n".join([
        "",
        "Try next:",
        "  memactors memory episodes                                   # the episodes, newest first",
        f'  memactors memory recall "flaky ledger" --repo {repo}     # finds run 42',
        f'  memactors memory recall "{OTHER_WORDS}" --repo {repo}',
        "                                                              # run 42 by meaning: the embedded model",
        '  memactors memory recall "flaky ledger" --repo forge.example/acme/billing   # another repository: nothing',
        "  memactors memory status                                     # provider, counts, embeddings",
        "  memactors doctor                                            # health rows",
        "  memactors tui                                               # the terminal view",
        f"The example configuration: {examples_dir() / 'harness.toml'}",
    ])


def cmd_demo(args: argparse.Namespace) -> int:
    from .runs import cmd_runs_ingest

    records = sorted(str(p) for p in examples_dir().glob("run-*.json"))
    if not records:
        raise SystemExit(f"memactors: no example run records in {examples_dir()} (a broken install: reinstall memactors)")
    status = cmd_runs_ingest(argparse.Namespace(**{**vars(args), "files": records}))
    if not args.json:
        print(next_steps())
    return status


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="ingest the packaged example run records into the running daemon",
                       description="Send the example run records that ship with memactors to the running daemon "
                                   "(as `runs ingest` does) and print commands to try on them. Run it again: the "
                                   "records are recognised as duplicates.")
    p.add_argument("--json", action="store_true", help="print one result per record as JSON (no next steps)")
    p.set_defaults(fn=cmd_demo)
