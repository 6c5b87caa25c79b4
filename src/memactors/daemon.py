"""`memactors serve`: the standalone daemon around the embedded memory service.

It loads the configuration (keeping the last good one on a failed SIGHUP reload), opens the service,
and serves the operator RPC (websocket), the agent gateway (MCP over streamable HTTP) and /metrics on
loopback. The listen addresses actually bound are written to `daemon.json` in the state directory, so
the CLI finds the daemon (and its tokens) without flags. SIGINT and SIGTERM stop it gracefully.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from loguru import logger

from .config import Config, ConfigHolder, load_config
from .errors import ConfigError
from .logs import configure_logging
from .metrics import Metrics, serve_metrics
from .rpc import ensure_tokens, serve_rpc
from .service import open_memory_service

DAEMON_FILE = "daemon.json"
STOP_GRACE = 5.0


@attrs.frozen
class Listening:
    operator: str
    gateway: str | None
    metrics: str
    state_dir: str
    pid: int


def write_daemon_file(state_dir: Path, listening: Listening) -> None:
    path = state_dir / DAEMON_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(attrs.asdict(listening), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_daemon_file(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state_dir / DAEMON_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


async def run_daemon(
    loader: Callable[[], Config],
    *,
    announce: Callable[[Listening], None] = lambda listening: None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled or signalled; reports the bound addresses once serving."""
    holder = await trio.to_thread.run_sync(ConfigHolder, loader)
    config = holder.current
    state_dir = config.store.path
    tokens = await trio.to_thread.run_sync(ensure_tokens, state_dir)
    metrics = Metrics()
    async with open_memory_service(holder, metrics=metrics) as memory, trio.open_nursery() as nursery:
        with _listen_error("[operator] listen", config.operator.address):
            op_host, op_port = await nursery.start(
                serve_rpc, memory.rpc_methods(), config.operator.host, config.operator.port, tokens)
        with _listen_error("[metrics] listen", config.metrics.address):
            m_host, m_port = await nursery.start(serve_metrics, metrics, config.metrics.host, config.metrics.port)
        with _listen_error("[gateway] listen", config.gateway.address):
            gateway_url = await memory.start_gateway(nursery)
        listening = Listening(
            operator=f"ws://{op_host}:{op_port}/harness.v1", gateway=gateway_url,
            metrics=f"http://{m_host}:{m_port}/metrics", state_dir=str(state_dir), pid=os.getpid())
        await trio.to_thread.run_sync(write_daemon_file, state_dir, listening)
        logger.bind(operator=listening.operator, gateway=gateway_url, metrics=listening.metrics,
                    provider=config.memory.provider).info("memactors serving")
        announce(listening)
        task_status.started(listening)
        try:
            await _signals(holder, nursery.cancel_scope)
        finally:
            # A stale daemon.json would send the CLI to a port nobody listens on.
            (state_dir / DAEMON_FILE).unlink(missing_ok=True)  # noqa: ASYNC240 -- one unlink at shutdown


@contextmanager
def _listen_error(key: str, address: str) -> Iterator[None]:
    """A listener that cannot bind is a configuration problem: name the key and the address."""
    try:
        yield
    except OSError as exc:
        raise _cannot_listen(key, address, exc) from None
    except BaseExceptionGroup as group:  # ok: re-raised unless it is the bind failure
        leaf = _first(group, OSError)
        if leaf is None:
            raise
        raise _cannot_listen(key, address, leaf) from None


def _first(group: BaseExceptionGroup, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` inside `group`, however deeply nested; None when there is none."""
    matched, _ = group.split(kind)
    leaf: BaseException | None = matched
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


def _cannot_listen(key: str, address: str, exc: BaseException) -> ConfigError:
    reason = getattr(exc, "strerror", None) or str(exc)
    return ConfigError(f"{key} = \"{address}\": cannot listen: {reason} (is another memactors daemon running?)",
                       key=key, value=address)


async def _signals(holder: ConfigHolder, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                try:
                    await trio.to_thread.run_sync(holder.reload)  # logs "configuration reloaded" once
                except ConfigError as exc:
                    logger.bind(error=str(exc)).error("configuration reload failed; keeping the last good one")
                continue
            logger.bind(signal=signal.Signals(signum).name).info("stopping")
            scope.cancel()
            return


def serve_main(config_path: Path | None) -> int:
    """Entry point of `memactors serve`."""

    def loader() -> Config:
        return load_config(config_path)

    def announce(listening: Listening) -> None:
        print(f"memactors serving (pid {listening.pid}, state in {listening.state_dir})", flush=True)
        print(f"  operator RPC  {listening.operator}", flush=True)
        if listening.gateway:
            print(f"  gateway (MCP) {listening.gateway}", flush=True)
        print(f"  metrics       {listening.metrics}", flush=True)
        print("Ctrl-C stops it.", flush=True)

    configure_logging(os.environ.get("MEMACTORS_LOG_LEVEL", "INFO"), json=bool(os.environ.get("MEMACTORS_LOG_JSON")))
    try:
        trio.run(lambda: run_daemon(loader, announce=announce), restrict_keyboard_interrupt_to_checkpoints=True)
    except BaseExceptionGroup as group:  # ok: a start-up failure inside the nurseries, reported plainly
        leaf = _first(group, ConfigError)
        if leaf is None:
            raise
        raise leaf from None
    return 0
