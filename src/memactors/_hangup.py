"""SIGHUP before the daemon is up: kept, and applied as a reload once it serves.

SIGHUP's default action ends a process. `memactors serve` therefore catches it first thing in the
process's entry — the top of `memactors.cli`, before the command line's own imports and its parser,
and before the daemon's (heavy) imports — and only notes it; the daemon queues one reload for what was
noted once its own signal handling is in place (`daemon.run_daemon`'s ``early_reload``) and applies it
once it serves. What remains is the interpreter's own start-up, before any code of ours runs.

Standard library only, and nothing is installed on import: a library user importing memactors keeps
its own SIGHUP disposition; only the ``serve`` command line asks for this.
"""

from __future__ import annotations

# The C module behind `signal`: the same functions, without `signal`'s enum wrappers, whose import
# (`enum`) is most of what this module would otherwise cost before SIGHUP is caught.
import _signal

TYPE_CHECKING = False  # `typing` is not imported: this module runs before anything else (see above)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["early_reload", "keep_early_hangups", "keep_for_serve", "names_serve"]

_hangups: list[int] = []
_kept = False


def keep_early_hangups() -> None:
    """From now on a SIGHUP is noted, not fatal. Idempotent; raises ValueError off the main thread."""
    global _kept
    if not _kept:
        _signal.signal(_signal.SIGHUP, lambda signum, frame: _hangups.append(signum))
        _kept = True


def early_reload() -> bool:
    """Whether a SIGHUP was noted since the last call (the daemon then queues one reload)."""
    seen = bool(_hangups)
    _hangups.clear()
    return seen


def names_serve(argv: Sequence[str]) -> bool:
    """Whether a command line (without the program name) is ``serve``: its first word that is neither
    an option nor ``--config``'s value."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--config":
            skip = True
        elif word.startswith("-"):
            continue
        else:
            return word == "serve"
    return False


def keep_for_serve(argv: Sequence[str]) -> None:
    """`keep_early_hangups` when ``argv`` is the ``serve`` command; nothing otherwise, or off the main
    thread (an embedding caller's import)."""
    if names_serve(argv):
        try:
            keep_early_hangups()
        except ValueError:
            pass
