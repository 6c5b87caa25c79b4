"""The plumbing around an agent's process, for the runs actor: its environment, its MCP config file, its
output read as it streams, signals to its process group, and the orphans a daemon that died left.

Kept apart from the actor (``actors/runs.py``), which decides *when* to start, stop and record a run;
this module only knows *how* to talk to a process and its files. Everything here either is pure or runs
off the trio loop, except the two stream readers, which are trio tasks.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

__all__ = ["MAX_LINE", "agent_env", "drain", "feed_stdin", "kill_group", "kill_orphan", "pump_lines",
           "remove_mcp_configs", "write_mcp_config"]

#: A stdout line longer than this is skipped (never held whole in memory).
MAX_LINE = 8 * 1024 * 1024


def agent_env(config: Any, environ: Any) -> dict[str, str]:
    """The daemon's environment as the agent gets it: everything but the daemon's own secret, the
    ``[model_api] api_key_env`` variable (the utility model's key is the daemon's, not the agent's)."""
    env = dict(environ)
    if config.model_api is not None and config.model_api.api_key_env:
        env.pop(config.model_api.api_key_env, None)
    return env


def write_mcp_config(directory: Path, gateway_url: str, token: str, adapter: Any = None) -> Path:
    """The run's MCP config naming the gateway with this run's token, mode 0600: Claude Code's
    ``--mcp-config`` JSON, or the adapter's own when it has one (``adapter.mcp_config(url, token)``: a JSON
    object, or a text such as pi's extension, written with ``adapter.mcp_config_suffix``)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    own = getattr(adapter, "mcp_config", None)
    body: Any = own(gateway_url, token) if callable(own) else {"mcpServers": {"memactors": {
        "type": "http", "url": gateway_url, "headers": {"Authorization": f"Bearer {token}"}}}}
    suffix = getattr(adapter, "mcp_config_suffix", ".json") if isinstance(body, str) else ".json"
    path = directory / f"mcp-{secrets.token_hex(8)}{suffix}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if isinstance(body, str):
            f.write(body)
        else:
            json.dump(body, f)
    return path


def remove_mcp_configs(directory: Path) -> int:
    """Delete the MCP config files a previous daemon left (it died mid-run); their tokens have expired or
    will. Called at start-up, when this daemon runs nothing yet. Returns how many."""
    removed = 0
    for path in directory.glob("mcp-*") if directory.is_dir() else ():
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def kill_group(proc: trio.Process, signum: int) -> None:
    """Signal the agent's whole process group (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_orphan(pid: int, harness: str, run_id: str) -> str:
    """A previous daemon died while its run's agent (``pid``) ran: kill that agent's process group if
    ``pid`` is still that agent, which its environment proves (``MEMACTORS_HARNESS`` and
    ``MEMACTORS_RUN_ID``, set by the runs actor), so a recycled pid is never signalled.

    Returns what happened: ``killed``, ``gone`` (no such process, or another one has the pid now) or
    ``unknown`` (this platform cannot tell whose the pid is: it is left alone)."""
    if not sys.platform.startswith("linux"):
        return "unknown"
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "unknown"
    wanted = {f"MEMACTORS_HARNESS={harness}".encode(), f"MEMACTORS_RUN_ID={run_id}".encode()}
    if not wanted <= set(environ):
        return "gone"
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "unknown"
    return "killed"


async def pump_lines(stream: Any, on_line: Callable[[str], None], done: trio.Event) -> None:
    """Hand stdout to ``on_line`` one decoded line at a time as it arrives; nothing is kept past the line.

    A line longer than MAX_LINE is skipped whole. ``done`` is set at EOF (or when the pipe breaks)."""
    buffer = bytearray()
    skipping = False
    try:
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            buffer += chunk
            while True:
                newline = buffer.find(b"\n")
                if newline < 0:
                    break
                line = bytes(buffer[:newline])
                del buffer[:newline + 1]
                if skipping:
                    skipping = False
                    continue
                on_line(line.decode("utf-8", "replace"))
            if len(buffer) > MAX_LINE:
                buffer.clear()
                skipping = True
        if buffer and not skipping:
            on_line(bytes(buffer).decode("utf-8", "replace"))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.set()


async def drain(stream: Any, feed: Callable[[bytes], None]) -> None:
    """Read ``stream`` (the agent's stderr) to EOF, handing each chunk to ``feed``; a full pipe would
    block the agent, so it is always read, whatever is kept of it."""
    try:
        while chunk := await stream.receive_some(65536):
            feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def feed_stdin(stream: Any, text: str) -> None:
    """Write ``text`` (the prompt, for an adapter that gives it on stdin) to the agent's stdin and close it:
    the end of input is what tells the agent the prompt is complete. An agent that exits without reading
    it breaks the pipe: its exit status and stream say what happened, so that is not an error here."""
    async with stream:
        try:
            await stream.send_all(text.encode("utf-8"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
