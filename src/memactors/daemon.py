"""`memactors serve`: the standalone daemon around the embedded memory service.

It loads the configuration, opens the service, reloads the configuration on SIGHUP and when harness.toml
or a harness_d drop-in changes on disk (keeping the last good one when a reload fails, REQ-1),
and serves the operator RPC (websocket), the agent gateway (MCP over streamable HTTP) and /metrics on
loopback. The listen addresses actually bound are written to `daemon.json` in the state directory, so
the CLI finds the daemon (and its tokens) without flags. SIGINT and SIGTERM stop it gracefully.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from loguru import logger

from .actors.kernel import SupervisorFailed
from .agents.spool import queued_revocations, send_spool, settle_revocations
from .config import Config, ConfigHolder, config_fingerprint, load_config
from .errors import ConfigError, MemactorsError, StoreDamaged, StoreUnavailable
from .gateway import start_gateway
from .logs import configure_logging
from .metrics import Metrics, serve_metrics
from .rpc.methods import operator_methods
from .rpc.server import serve_rpc
from .rpc.tokens import ensure_tokens
from .service import open_memory_service
from .store import private_dir
from .store.health import disk_full_at_start

DAEMON_FILE = "daemon.json"
LOCK_FILE = "daemon.lock"
STOP_GRACE = 5.0
#: Exit status when the memory service's supervisor gave up (EX_TEMPFAIL): the daemon cannot go on,
#: but a fresh start may well work, so a service manager should restart it (docs/operations.md).
EXIT_GAVE_UP = 75


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as the kernel allows); return (soft, hard).

    Every connection costs a file descriptor; a low soft limit (often 1024) is reached long before the
    machine is short of anything. Raising the soft limit to the hard one needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        for candidate in (target, 1 << 20, 1 << 16):
            if candidate <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (candidate, hard))
                break
            except (ValueError, OSError):
                continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@attrs.frozen
class Listening:
    operator: str
    gateway: str | None
    metrics: str
    state_dir: str
    pid: int
    #: The web console's address; None unless ``[console] enabled``.
    console: str | None = None


def write_daemon_file(state_dir: Path, listening: Listening) -> None:
    path = state_dir / DAEMON_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(attrs.asdict(listening), indent=2) + "\n")
    os.replace(tmp, path)


def lock_state_dir(state_dir: Path) -> int:
    """Take the state directory for this process: an exclusive `flock` on `daemon.lock`, held (by the
    returned descriptor) until the process exits. A second daemon on the same directory fails at once,
    naming the directory and the pid holding it, before it touches anything there (daemon.json
    included). A directory that cannot be made private or written (not ours, immutable, a read-only
    mount) is one line naming it and the cause, like a store file that cannot be used.
    Blocking file I/O: call it through a thread from async code."""
    path = state_dir / LOCK_FILE
    try:
        private_dir(state_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreDamaged(f"state directory {state_dir} cannot be used: {exc.strerror or exc}") from None
    os.fchmod(fd, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"state directory {state_dir} is in use by another memactors daemon (pid {holder})",
                          key="[store] path", value=str(state_dir)) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        full = disk_full_at_start(state_dir, exc)
        if full is not None:
            raise full from None
        raise StoreDamaged(f"state directory {state_dir} cannot be used: {exc.strerror or exc}") from None
    return fd


def read_daemon_file(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / DAEMON_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def run_daemon(
    loader: Callable[[], Config],
    *,
    announce: Callable[[Listening], None] = lambda listening: None,
    early_reload: Callable[[], bool] = lambda: False,
    config_poll: float | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled or signalled; reports the bound addresses once serving.

    ``config_poll``: seconds between looks at the configuration files (default
    :data:`CONFIG_POLL_SECONDS`; 0 turns the file watch off, leaving SIGHUP).

    ``early_reload`` says whether a SIGHUP came before this function's own handlers were in place
    (`EarlyHangup`, installed by `serve_main` before the first log line): it is queued like any other.

    Signal handling is the first thing in place, before the configuration is read, the state directory
    locked or any listener opened: SIGHUP's default action kills a process, and a SIGHUP
    that arrived while the listeners were still opening did. A reload asked for during start-up is
    queued and applied once the daemon serves (several coalesce into one); SIGINT or SIGTERM during
    start-up abandon it, and once serving stop the daemon gracefully.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        try:
            async with trio.open_nursery() as nursery:
                control = _Control(stop_scope=nursery.cancel_scope)
                if early_reload():  # after the receiver is open: no SIGHUP falls between the two
                    control.queue_reload()
                nursery.start_soon(_watch_signals, signals, control)
                nursery.start_soon(_apply_reloads, control)
                poll = CONFIG_POLL_SECONDS if config_poll is None else config_poll
                if poll > 0:
                    nursery.start_soon(_watch_config_files, control, poll)
                holder = await trio.to_thread.run_sync(ConfigHolder, loader)
                config = holder.current
                state_dir = config.store.path
                lock = await trio.to_thread.run_sync(lock_state_dir, state_dir)
                try:
                    await _serve(holder, state_dir, announce, task_status, control)
                except Exception as exc:  # ok: re-raised as it is unless the disk is full
                    # Any start-up step (tokens, daemon.json, the store, its WAL) can meet a full disk:
                    # one line saying so, exit 8, never "damaged" or a traceback.
                    full = disk_full_at_start(state_dir, exc)
                    if full is None:
                        raise
                    raise full from None
                finally:
                    os.close(lock)  # releases the flock
                nursery.cancel_scope.cancel()  # served and stopped: the signal and reload tasks end too
        except BaseExceptionGroup as group:  # ok: unwrapped at this edge, re-raised whole otherwise
            # The signal tasks do not fail: a group of one is the start-up's or the service's own
            # exception (a configuration error, a listener that cannot bind), raised as it was before
            # this nursery existed.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


@attrs.define
class _Control:
    """What the signal task needs to act on a signal at any point of the daemon's life."""

    #: Cancelled by SIGINT/SIGTERM: the whole start-up until the daemon serves, then only the serving
    #: nursery, so the memory service still closes gracefully (flushing what it holds).
    stop_scope: trio.CancelScope
    #: The configuration, once loaded and serving: reloads wait for it.
    holder: ConfigHolder | None = None
    serving: trio.Event = attrs.field(factory=trio.Event)
    #: At most one reload waiting: SIGHUPs that arrive before the last is applied coalesce into it.
    reloads: tuple[trio.MemorySendChannel[None], trio.MemoryReceiveChannel[None]] = attrs.field(
        factory=lambda: trio.open_memory_channel[None](1))

    def queue_reload(self) -> None:
        if not self.serving.is_set():
            logger.info("configuration reload queued until start-up completes")
        try:
            self.reloads[0].send_nowait(None)
        except trio.WouldBlock:
            pass  # one is already waiting: it reads the files as they are then

    def now_serving(self, holder: ConfigHolder, scope: trio.CancelScope) -> None:
        self.holder = holder
        self.stop_scope = scope
        self.serving.set()


async def _serve(holder: ConfigHolder, state_dir: Path, announce: Callable[[Listening], None],
                 task_status: trio.TaskStatus[Listening], control: _Control) -> None:
    config = holder.current
    tokens = await trio.to_thread.run_sync(ensure_tokens, state_dir)
    metrics = Metrics()
    async with open_memory_service(holder, metrics=metrics) as memory, trio.open_nursery() as nursery:
        methods = operator_methods(memory)  # the RPC's table; the console calls the same methods
        with _listen_error("[operator] listen", config.operator.address):
            op_host, op_port = await nursery.start(
                serve_rpc, methods, config.operator.host, config.operator.port, tokens)
        with _listen_error("[metrics] listen", config.metrics.address):
            m_host, m_port = await nursery.start(partial(
                serve_metrics, metrics, config.metrics.host, config.metrics.port, ready=_readiness(memory)))
        # Before the gateway serves: a token `uninstall` revoked while the daemon was down is refused
        # from the first request on.
        await _apply_revocations(memory, state_dir)
        with _listen_error("[gateway] listen", config.gateway.address):
            gateway_url = await start_gateway(memory, nursery)
        console_url = None
        if config.console.enabled:
            from .console import serve_console  # jinja2 and the templates only when the console is on

            with _listen_error("[console] listen", config.console.listen.address):
                c_host, c_port = await nursery.start(partial(
                    serve_console, methods, tokens, metrics.registry, config.console.listen.host,
                    config.console.listen.port, harnesses=lambda: sorted(holder.current.harness),
                    token_dir=str(state_dir)))
            console_url = f"http://{'[' + c_host + ']' if ':' in c_host else c_host}:{c_port}/"
        listening = Listening(
            operator=f"ws://{op_host}:{op_port}/harness.v1", gateway=gateway_url,
            metrics=f"http://{m_host}:{m_port}/metrics", state_dir=str(state_dir), pid=os.getpid(),
            console=console_url)
        # The handlers were in place before any of this (run_daemon): a SIGTERM sent as soon as
        # daemon.json appears stops the daemon gracefully instead of killing it with the default action.
        try:
            await trio.to_thread.run_sync(write_daemon_file, state_dir, listening)
            logger.bind(operator=listening.operator, gateway=gateway_url, metrics=listening.metrics,
                        provider=config.memory.provider).info("memactors serving")
            announce(listening)
            task_status.started(listening)
            nursery.start_soon(_send_spool, memory, state_dir)
            control.now_serving(holder, nursery.cancel_scope)
            await trio.sleep_forever()  # until a signal cancels the serving nursery
        finally:
            # A stale daemon.json would send the CLI to a port nobody listens on.
            (state_dir / DAEMON_FILE).unlink(missing_ok=True)  # noqa: ASYNC240 -- one unlink at shutdown


async def _apply_revocations(memory: Any, state_dir: Path) -> None:
    """Revoke the run tokens `memactors uninstall` queued while no daemon was reachable (spool.py)."""
    queued = await trio.to_thread.run_sync(queued_revocations, state_dir)
    applied: list[dict[str, str]] = []
    for entry in queued:
        try:
            await memory.revoke_run_tokens(harness=entry["harness"], run_id=entry["run_id"])
        except MemactorsError as exc:  # kept for the next start
            logger.bind(harness=entry["harness"], run=entry["run_id"], error=type(exc).__name__).warning(
                "queued token revocation not applied; kept for the next start")
            continue
        applied.append(entry)
        logger.bind(harness=entry["harness"], run=entry["run_id"], queued_at=entry["queued_at"]).info(
            "queued token revocation applied")
    if queued:
        await trio.to_thread.run_sync(settle_revocations, state_dir, applied)


async def _send_spool(memory: Any, state_dir: Path) -> None:
    """Send the sessions a hook spooled while no daemon was reachable (agents/spool.py), once we serve."""
    try:
        counts = await send_spool(state_dir, memory.ingest_runs)
    except (OSError, MemactorsError) as exc:  # the spool keeps what was not confirmed: nothing is lost
        logger.bind(error=type(exc).__name__).warning("session spool not sent; left for the next hook or start")
        return
    if counts:
        logger.bind(**counts).info("spooled sessions sent")


def _readiness(memory: Any) -> Callable[[], Awaitable[str | None]]:
    """/readyz: ready when the store answers (PostgreSQL up), the provider session is ready, its breaker
    closed and the store can write; else a short reason."""

    async def ready() -> str | None:
        store_error = await memory.store.ping()
        if store_error is not None:
            return f"store unreachable: {store_error}"
        status = memory.session.status()
        if status.state != "ready":
            return f"provider {status.provider} is {status.state}"
        if status.breaker != "closed":
            return f"provider {status.provider} breaker is {status.breaker}"
        store = await trio.to_thread.run_sync(memory.store.health.snapshot)
        if not store["writable"]:
            return f"store {store['path']} is not writable: {store['error']} ({store['free_bytes']} bytes free)"
        return None

    return ready


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


async def _watch_signals(signals: AsyncIterator[int], control: _Control) -> None:
    """SIGHUP queues a reload (applied by `_apply_reloads` once serving); SIGINT/SIGTERM stop."""
    async for signum in signals:
        if signum == signal.SIGHUP:
            control.queue_reload()
            continue
        logger.bind(signal=signal.Signals(signum).name,
                    starting=None if control.serving.is_set() else True).info("stopping")
        control.stop_scope.cancel()
        return


async def _apply_reloads(control: _Control) -> None:
    """Reload the configuration for each queued SIGHUP, in order, once the daemon serves."""
    _, receive = control.reloads
    await control.serving.wait()
    holder = control.holder
    assert holder is not None
    async for _ in receive:
        try:
            await trio.to_thread.run_sync(holder.reload)  # logs "configuration reloaded" once
        except ConfigError as exc:
            logger.bind(error=str(exc)).error("configuration reload failed; keeping the last good one")


#: How often the daemon looks at harness.toml and its drop-ins for an edit (a stat of each, no read).
CONFIG_POLL_SECONDS = 1.0


def _config_poll(env: Mapping[str, str]) -> float | None:
    """``MEMACTORS_CONFIG_POLL_SECONDS``: how often to look at the files; 0 leaves only SIGHUP."""
    text = env.get("MEMACTORS_CONFIG_POLL_SECONDS")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"MEMACTORS_CONFIG_POLL_SECONDS = {text!r}: not a number of seconds",
                          key="MEMACTORS_CONFIG_POLL_SECONDS") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"MEMACTORS_CONFIG_POLL_SECONDS = {text!r}: must be 0 or more seconds",
                          key="MEMACTORS_CONFIG_POLL_SECONDS")
    return value


async def _watch_config_files(control: _Control, interval: float = CONFIG_POLL_SECONDS) -> None:
    """Queue a reload when the global file or a drop-in changed on disk, as SIGHUP does.

    Polls the files' stat fingerprint (``config_fingerprint``) once the daemon serves: a file edited,
    added or removed is noticed within ``interval``. The holder records what each attempt saw, so a
    broken edit is tried once, logged, and the last good configuration stays (REQ-1) until the file
    changes again."""
    await control.serving.wait()
    holder = control.holder
    assert holder is not None
    queued: tuple[Any, ...] | None = None
    while True:
        await trio.sleep(interval)
        now = await trio.to_thread.run_sync(config_fingerprint, holder.current.global_path)
        if now != holder.seen and now != queued:
            queued = now
            logger.bind(path=str(holder.current.global_path)).info("configuration files changed; reloading")
            control.queue_reload()


class EarlyHangup:
    """A SIGHUP handler for the moments before `run_daemon`'s own are in place (the interpreter is
    already running, trio is not yet): it notes the signal instead of letting SIGHUP's default action
    kill the process, and `run_daemon` queues the reload it stands for. trio's receiver replaces it."""

    def __init__(self) -> None:
        self.seen = False
        signal.signal(signal.SIGHUP, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.seen = True

    def take(self) -> bool:
        seen, self.seen = self.seen, False
        return seen


def serve_main(config_path: Path | None, *, early_reload: Callable[[], bool] | None = None) -> int:
    """Entry point of `memactors serve`. ``early_reload`` is the caller's own early SIGHUP note (the CLI
    installs one before importing this module); without one, `EarlyHangup` is installed here, first."""
    if early_reload is None:
        early_reload = EarlyHangup().take  # a SIGHUP from here on is a reload, never the end of the process

    def loader() -> Config:
        return load_config(config_path)

    def announce(listening: Listening) -> None:
        print(f"memactors serving (pid {listening.pid}, state in {listening.state_dir})", flush=True)
        print(f"  operator RPC  {listening.operator}", flush=True)
        if listening.gateway:
            print(f"  gateway (MCP) {listening.gateway}", flush=True)
        print(f"  metrics       {listening.metrics}", flush=True)
        if listening.console:
            print(f"  console       {listening.console}", flush=True)
        print("Ctrl-C stops it.", flush=True)

    # Whatever else lands in the state directory (logs, a future file) is private too; the known files
    # set their modes explicitly as well.
    os.umask(0o077)
    configure_logging(os.environ.get("MEMACTORS_LOG_LEVEL", "INFO"), json=bool(os.environ.get("MEMACTORS_LOG_JSON")))
    soft, hard = raise_nofile_limit()
    logger.bind(nofile_soft=soft, nofile_hard=hard).info("file descriptor limit")
    try:
        trio.run(lambda: run_daemon(loader, announce=announce, early_reload=early_reload,
                                    config_poll=_config_poll(os.environ)),
                 restrict_keyboard_interrupt_to_checkpoints=True)
    except SupervisorFailed as exc:
        return _gave_up(exc)
    except StoreUnavailable as exc:
        return _no_store(exc)
    except BaseExceptionGroup as group:  # ok: a start-up failure inside the nurseries, reported plainly
        gave_up = _first(group, SupervisorFailed)
        if isinstance(gave_up, SupervisorFailed):
            return _gave_up(gave_up)
        unreachable = _first(group, StoreUnavailable)
        if isinstance(unreachable, StoreUnavailable):
            return _no_store(unreachable)
        leaf = _first(group, ConfigError)
        if leaf is None:
            raise
        raise leaf from None
    return 0


def _no_store(exc: StoreUnavailable) -> int:
    """A PostgreSQL store that cannot be reached at start: the daemon cannot check or migrate its schema,
    so it does not start. One clear line naming the store (never its password); exit 75 so a service
    manager tries again (during operation an outage is contained instead: docs/fleet.md)."""
    logger.bind(exit_status=EXIT_GAVE_UP, store=exc.context.get("store")).critical(
        f"cannot start: {exc.message}; exiting so a service manager can restart the daemon")
    return EXIT_GAVE_UP


def _gave_up(exc: SupervisorFailed) -> int:
    """One clear line, no traceback: the service manager decides what happens next."""
    logger.bind(exit_status=EXIT_GAVE_UP, child=exc.context.get("child")).critical(
        f"memory service gave up: {exc}; exiting so a service manager can restart the daemon")
    return EXIT_GAVE_UP
