"""What every command group shares: finding the configuration, the daemon and its token; one RPC call;
output helpers; exit statuses.

Standard library only at the top (see the package docstring: start-up cost matters).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Config


SERVICE = "harness.v1.MemoryService"
DAEMON_FILE = "daemon.json"  # written by daemon.py; read here without importing the daemon

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_INVALID = 5
EXIT_PERMISSION = 6
EXIT_INTERNAL = 7
EXIT_RESOURCE = 8
EXIT_INTERRUPTED = 130


#: gRPC code name (of an RpcError or a MemactorsError) -> exit status.
CODE_EXITS = {
    "UNAVAILABLE": EXIT_UNAVAILABLE,
    "DEADLINE_EXCEEDED": EXIT_UNAVAILABLE,
    "NOT_FOUND": EXIT_NOT_FOUND,
    "INVALID_ARGUMENT": EXIT_INVALID,
    "FAILED_PRECONDITION": EXIT_INVALID,
    "OUT_OF_RANGE": EXIT_INVALID,
    "PERMISSION_DENIED": EXIT_PERMISSION,
    "UNAUTHENTICATED": EXIT_PERMISSION,
    "RESOURCE_EXHAUSTED": EXIT_RESOURCE,
}


JSON_HELP = "print the raw result as JSON (for scripts)"


class CliError(Exception):
    """A failure the CLI explains in one line and maps to an exit status by its gRPC code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def load(args: argparse.Namespace) -> Config:
    from ..config import load_config

    return load_config(Path(args.config) if getattr(args, "config", None) else None)


def read_daemon_file(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / DAEMON_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def operator_url(config: Config) -> str:
    found = read_daemon_file(config.store.path)
    if found and found.get("operator"):
        return str(found["operator"])
    return f"ws://{config.operator.address}/harness.v1"


def token_for(config: Config, tier: str) -> str:
    """The operator token of `tier` from the state directory (the files rpc.ensure_tokens writes),
    read here so a command does not import the trio RPC client just to find it."""
    path = config.store.path / f"operator-{tier}.token"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise CliError("UNAVAILABLE", f"no daemon has run with state directory {config.store.path} (no operator "
                                      "token file there); start one with `memactors serve`") from None
    except OSError as exc:
        raise CliError("PERMISSION_DENIED", f"cannot read {path}: {exc.strerror}") from None
    if not token:
        raise CliError("INVALID_ARGUMENT", f"operator token file {path} is empty")
    return token


def config_for(args: argparse.Namespace, tier: str) -> Config:
    """The configuration; for a read command, with an invalid file, the state directory alone (the
    daemon runs on its last good configuration, and a read command can ask it what is wrong)."""
    from ..errors import ConfigError

    try:
        return load(args)
    except ConfigError as exc:
        if tier != "read":
            raise
        return config_despite(args, exc)


def config_despite(args: argparse.Namespace, error: Exception) -> Config:
    """Defaults plus the file's `[store] path` if that much can be read; warns naming the config error."""
    import tomllib

    import attrs

    from ..config import Config, StoreConfig, default_config_path

    print(f"memactors: warning: {error}; using the state directory only", file=sys.stderr)
    path = Path(args.config) if args.config else default_config_path()
    try:
        store = tomllib.loads(path.read_text(encoding="utf-8")).get("store", {}).get("path")
    except (OSError, ValueError, AttributeError):
        store = None
    config = Config()
    if isinstance(store, str):
        state = Path(store).expanduser()
        config = attrs.evolve(config, store=StoreConfig(state if state.is_absolute() else path.parent / state))
    return config


def call(args: argparse.Namespace, method: str, params: dict[str, Any], tier: str = "read") -> Any:
    """One RPC call over the standard-library websocket client (see rpc.wsclient: the trio client's
    imports alone cost more than a read command's start-up budget)."""
    from ..rpc.wsclient import WsRpcError, call_once

    config = config_for(args, tier)
    token = token_for(config, tier)
    try:
        return call_once(operator_url(config), token, f"{SERVICE}/{method}", params)
    except WsRpcError as exc:
        raise CliError(exc.code, f"{exc.code}: {exc.message}") from None


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def per_second(count: int, seconds: float) -> float:
    """`count` things in `seconds`, per second (to one decimal; 0 when nothing was timed)."""
    return round(count / seconds, 1) if seconds > 0 else 0.0


def rate_line(count: int, seconds: float) -> str:
    """What `runs ingest` and `memactors import` say on stderr about their speed."""
    return f"{count} record(s) in {seconds:.2f} s: {per_second(count, seconds):.0f} records/s"


def notice(result: dict[str, Any]) -> None:
    """Tell the operator on stderr what the daemon made of a `--repo` value (normalised, matched by its
    tail, or unknown with close known ones), so a scope mismatch is never silent."""
    repo = result.get("repo_match")
    if not repo:
        return
    if repo.get("status") == "unknown":
        close = repo.get("close") or []
        hint = f"; close known ones: {', '.join(close)}" if close else "; no known repository is close"
        print(f"memactors: no episodes in repository {repo['key']}{hint}", file=sys.stderr)
    elif repo.get("given") != repo.get("key"):
        print(f"memactors: repository {repo['given']!r} read as {repo['key']}", file=sys.stderr)


def confirm(question: str, *, assume_yes: bool) -> bool:
    """Ask `question` on the terminal; refuse (CliError) when there is no terminal to ask on."""
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("INVALID_ARGUMENT", "refusing to forget without confirmation: stdin is not a terminal; "
                                           "pass --yes to confirm")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


class StatusLine:
    """One line on stderr, redrawn in place while a long command works (its progress), when stderr is a
    terminal and the output is not JSON; silent otherwise. ``clear`` leaves the terminal as it was."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K" + text)
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self.enabled and self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def bar(done: int, total: int, width: int = 30) -> str:
    """``[#####.....] done/total`` (full when there is nothing to do)."""
    filled = width * done // total if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def exit_for(code: str) -> int:
    return CODE_EXITS.get(code, EXIT_INTERNAL)


# -- the CLI's one error edge ---------------------------------------------------------------------------


def leaves(exc: BaseException) -> list[BaseException]:
    """Every exception inside `exc` (itself when it is not a group), depth first, in order."""
    out: list[BaseException] = []
    stack = [exc]
    while stack:
        current = stack.pop()
        if isinstance(current, BaseExceptionGroup):
            stack.extend(reversed(current.exceptions))
        else:
            out.append(current)
    return out


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc` says the connection to the daemon failed or dropped below the RPC client (a reset
    socket, a closed websocket, a broken trio stream), which is the daemon being unavailable."""
    if isinstance(exc, ConnectionError | TimeoutError) and not isinstance(exc, BrokenPipeError):
        return True
    trio = sys.modules.get("trio")  # only loaded by the commands that use it
    if trio is not None and isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
        return True
    websocket = sys.modules.get("trio_websocket")
    return websocket is not None and isinstance(exc, websocket.ConnectionClosed | websocket.HandshakeError)


def explain(exc: BaseException) -> tuple[int, str | None] | None:
    """The exit status and the one stderr line for what a command raised, or None for a bug.

    Exception groups (a trio nursery's) are unwrapped here, deliberately, at the CLI's edge: a daemon
    that is down or a connection that drops is one line and exit 3 whichever task noticed it first. A
    group holding anything the CLI cannot explain is a bug and keeps its traceback.
    """
    from ..errors import MemactorsError

    found = [e for e in leaves(exc) if not _is_cancelled(e)] or [exc]
    explainable = (KeyboardInterrupt, CliError, MemactorsError, BrokenPipeError)
    if any(not isinstance(e, explainable) and not lost_connection(e) for e in found):
        return None
    for e in found:
        if isinstance(e, KeyboardInterrupt):
            return EXIT_INTERRUPTED, "memactors: interrupted"
    for e in found:
        if isinstance(e, CliError):
            return exit_for(e.code), f"memactors: {e.message}"
        if isinstance(e, MemactorsError):  # RpcError, ConfigError and the other sentinels carry a gRPC code
            code = getattr(e, "code", "INTERNAL")
            prefix = f"{code}: " if type(e).__name__ == "RpcError" else ""
            return exit_for(code), f"memactors: {prefix}{e}"
    for e in found:
        if lost_connection(e):
            return EXIT_UNAVAILABLE, f"memactors: UNAVAILABLE: the connection to the daemon was lost ({type(e).__name__})"
    # `memactors ... | head`: the reader left, which is not an error; stop writing into the pipe.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0, None


def _is_cancelled(exc: BaseException) -> bool:
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)
