"""The vector back-fill after `runs ingest` and `import ...`: how many of the episodes just
recorded still wait for their vector, and, with `--wait-vectors`, a progress bar until none does.

Recall never waits for the back-fill (an episode without a vector is ranked on its text), but it ranks
better once every episode has one: a script that asks right after an import can wait for that here.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import _core as core
from ._core import EXIT_FAILED, EXIT_OK

WAIT_HELP = ("then wait until every episode has its vector (the embedding back-fill), with progress on stderr;"
             " recall works meanwhile, ranking those without one on their text")


def add_wait_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait-vectors", action="store_true", help=WAIT_HELP)


def follow(args: argparse.Namespace, *, quiet: bool) -> int:
    """After an ingest: with `--wait-vectors`, follow the back-fill until no episode is without a vector
    (EXIT_FAILED, naming the error, when the embedder fails); else one line on stderr when some still
    are. Nothing when embeddings are off. `quiet` (`--json`): no progress, the one line still said."""
    status = _embeddings(args)
    if status is None or status.get("off"):
        if getattr(args, "wait_vectors", False) and status is not None:
            print(f"memactors: --wait-vectors: no back-fill runs ({status['off']})", file=sys.stderr)
        return EXIT_OK
    if not getattr(args, "wait_vectors", False):
        pending = int(status.get("pending", 0))
        if pending:
            print(f"{pending} of {status.get('episodes', 0)} episodes still without a vector: the back-fill runs in"
                  f" the background (--wait-vectors waits for it; `memactors memory status` shows it)",
                  file=sys.stderr)
        return EXIT_OK
    line = core.StatusLine(sys.stderr.isatty() and not quiet)
    started = time.monotonic()
    try:
        # Records queued by a slow provider are recorded (then embedded) within seconds: waited for too.
        while int(status.get("pending", 0)) or status.get("running") or status.get("records_pending"):
            line.show(f"vectors {core.bar(int(status.get('with_vector', 0)), int(status.get('episodes', 0)))}")
            if status.get("last_error"):
                line.clear()
                print(f"memactors: the embedder failed ({status['last_error']}); it tries again by itself;"
                      f" {status.get('pending')} episodes still without a vector", file=sys.stderr)
                return EXIT_FAILED
            time.sleep(0.5)  # ok: the CLI is synchronous here (no trio loop); polls the daemon twice a second
            status = _embeddings(args) or {}
    finally:
        line.clear()
    print(f"{status.get('with_vector', 0)} of {status.get('episodes', 0)} episodes have their vector"
          f" ({time.monotonic() - started:.1f} s waited)", file=sys.stderr)
    return EXIT_OK


def _embeddings(args: argparse.Namespace) -> dict[str, Any] | None:
    """`memory status`'s embeddings, and how many records still wait to be recorded."""
    status = core.call(args, "Status", {})
    embeddings: dict[str, Any] | None = status.get("embeddings")
    if embeddings is not None:
        embeddings = {**embeddings, "records_pending": int((status.get("pending") or {}).get("records") or 0)}
    return embeddings
