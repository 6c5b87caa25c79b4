"""The runs actor: the daemon runs ``[harness.<name>]`` one-shots with real agent CLIs and records them.

``StartRun`` (``memactors run <harness>``) prepares a run and starts one task for it in the actor's
nursery, which owns the child process, its deadline and the run record written when it ends:

1. **Prepare** (in the actor, off the loop for git and files): the harness's ``workdir``, its repository
   and branch; the repository's project ``harness.toml`` loaded over the global configuration as a
   project file (so REQ-1/8/16's project-file rules hold for a run); the prompt (``--prompt`` overrides
   the configured one for this run only); the run's bearer token (expiring with the run); a per-run
   ``--mcp-config`` file (mode 0600, state directory, deleted after the run); then ``prepare_spawn``
   computes the briefing and composes the prompt (REQ-16: exposure before spawn, the argument limit,
   the skip WARN and metric). The adapter turns all that into argv and environment.
2. **Supervise**: the process runs in the workdir in its own process group. Its stdout is parsed line
   by line as it streams by the adapter's parser and never kept; stderr is discarded. After
   ``[harness.<name>] timeout`` the group gets SIGTERM, then SIGKILL after a grace: outcome
   ``timed_out``, reason ``deadline``. Stopping the daemon stops every run the same way: outcome
   ``cancelled``, reason ``operator_cancel`` (the operator stopped the daemon), and still records it.
3. **Record**: the run record is built from what happened (exit status, the agent's own result event,
   the deadline or stop; model and cost when reported; the final answer; one edit event per file
   written, cross-checked with git; verify events for the test commands the agent ran; the rules are
   ``run_record.py``'s), and sent down
   ``IngestRun``'s path, so the episode appears as soon as the process ends. The token then expires
   after a short grace.

The composed prompt exists only in the child's argv: it is never logged, stored or sent anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import attrs
import trio
from loguru import logger

from .. import graph
from .._kernel import open_mailbox, serve
from ..adapters import Adapter, LaunchRequest, StreamParser, Transcript, get_adapter
from ..config import Config, HarnessConfig, load_config
from ..errors import InvalidArgument, MemactorsError, UnknownRun, exit_status
from ..repo import resolve_repo
from ..run_record import StopReason, build_run_record, git_changed, git_start
from ..spawn import prepare_spawn
from ..store import iso

__all__ = ["GetRun", "RunState", "Runs", "StartRun", "build_run_record", "exit_status"]

#: SIGTERM to SIGKILL.
KILL_GRACE = 5.0
#: A run token stays valid this long after its run ended (for a record the agent is still writing).
TOKEN_GRACE = 30.0
#: Finished runs remembered for WaitRun.
KEEP_FINISHED = 256
#: A stdout line longer than this is skipped (never held whole in memory).
MAX_LINE = 8 * 1024 * 1024


# -- messages -------------------------------------------------------------------------------------------

@attrs.frozen
class StartRun:
    """Start a run of ``harness``; ``prompt`` replaces the configured prompt for this run only."""

    harness: str
    prompt: str | None = None
    run_id: str | None = None


@attrs.frozen
class GetRun:
    """The state of a run this daemon started (running, or among the last finished ones)."""

    harness: str
    run_id: str


@attrs.define(eq=False)
class RunState:
    """One run as the actor tracks it; ``done`` is set once its record went down the ingest path."""

    harness: str
    run_id: str
    adapter: str
    started_at: str
    state: Literal["running", "ended"] = "running"
    outcome: str | None = None
    reason: str | None = None
    episode_id: str | None = None
    ingest: str | None = None
    exit_code: int | None = None
    #: Why the agent could not be started (e.g. "FileNotFoundError: claude"); None otherwise.
    error: str | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope | None = None
    stop_reason: StopReason | None = None

    def stop(self, reason: StopReason) -> None:
        """Stop the process the way a deadline does (SIGTERM, grace, SIGKILL); it is still recorded."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.scope is not None:
            self.scope.cancel()

    def view(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "harness": self.harness, "adapter": self.adapter, "state": self.state,
                "started_at": self.started_at, "outcome": self.outcome, "reason": self.reason,
                "episode_id": self.episode_id, "ingest": self.ingest, "exit_code": self.exit_code,
                "error": self.error}


@attrs.frozen
class _Prepared:
    """Everything a run task needs; ``argv`` holds the composed prompt and is never logged."""

    cfg: HarnessConfig
    adapter: Adapter
    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    repo_key: str | None
    toplevel: str | None
    branch: str | None
    start_commit: str | None
    dirty_at_start: frozenset[str]
    mcp_config: Path | None


class _RunScope:
    """What ``prepare_spawn`` reads: the service, with the run's configuration (project file merged)."""

    def __init__(self, service: Any, config: Config) -> None:
        self._service = service
        self.config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


# -- the actor ------------------------------------------------------------------------------------------

class Runs:
    """Owns every run it starts: one task per run in its nursery (ARCHITECTURE "Runs")."""

    def __init__(self, service: Any, *, gateway_url: Callable[[], str | None], kill_grace: float = KILL_GRACE,
                 token_grace: float = TOKEN_GRACE) -> None:
        self._service = service
        self._gateway_url = gateway_url
        self.kill_grace = kill_grace
        self.token_grace = token_grace
        self._active: dict[tuple[str, str], RunState] = {}
        self._starting: set[tuple[str, str]] = set()
        self._finished: OrderedDict[tuple[str, str], RunState] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._log = logger.bind(actor="runs")
        self.address, self._mailbox = open_mailbox("runs", 16)

    @property
    def shutdown_grace(self) -> float:
        """How long stopping the actor may take: every run stopped, then recorded."""
        return self.kill_grace + self._record_budget() + 10.0

    def _record_budget(self) -> float:
        # Assembly may wait REQ-7's 10 s for a summary, then one record attempt under provider_timeout.
        return self._service.config.episodes.provider_timeout + 15.0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as runs:
            self._nursery = runs
            task_status.started(self.address)
            try:
                await serve(self._mailbox, self._handle, concurrency=4)
            finally:
                # The mailbox closed (the daemon is stopping) or the actor is cancelled: stop every run
                # the way a deadline does; the nursery waits while they are recorded.
                for state in list(self._active.values()):
                    state.stop("operator_cancel")
                if self._active:
                    self._log.bind(runs=len(self._active)).info("stopping running runs")

    async def _handle(self, message: object) -> RunState:
        match message:
            case StartRun():
                return await self._start(message)
            case GetRun(harness=harness, run_id=run_id):
                key = (harness, run_id)
                state = self._active.get(key) or self._finished.get(key)
                if state is None:
                    raise UnknownRun(f"no run {run_id} of harness {harness} in this daemon", harness=harness,
                                     run=run_id)
                return state
            case _:
                raise TypeError(f"runs cannot handle {type(message).__name__}")

    # -- prepare ------------------------------------------------------------------------------------------
    async def _start(self, message: StartRun) -> RunState:
        service = self._service
        config: Config = service.config
        name = message.harness
        cfg = config.harness.get(name)
        if cfg is None:
            raise InvalidArgument(f"unknown harness {name}", field="harness")
        workdir = await _workdir(cfg, config)
        repo = await resolve_repo(workdir)
        if repo is not None:
            project = Path(repo.toplevel) / "harness.toml"
            if await trio.Path(project).is_file():
                # The global files again, with the repository's project file: its rules (global-only keys,
                # project-only upstreams) are checked here, and its keys apply to this run.
                config = await trio.to_thread.run_sync(
                    lambda: load_config(config.global_path, project_files=[project]))
                cfg = config.harness[name]
        if message.prompt is not None:
            cfg = attrs.evolve(cfg, prompt=message.prompt, prompt_file=None, prompt_template=None,
                               prompt_template_file=None, template_text=None)
            config = attrs.evolve(config, harness=MappingProxyType({**config.harness, name: cfg}))
        adapter = get_adapter(cfg.harness)
        run_id = message.run_id or _new_run_id(service.wall_clock())
        key = (name, run_id)
        if key in self._active or key in self._starting:
            raise InvalidArgument(f"run {run_id} of harness {name} is already running", field="run_id")
        self._starting.add(key)
        try:
            return await self._spawn(config, cfg, adapter, key, workdir, repo)
        finally:
            self._starting.discard(key)

    async def _spawn(self, config: Config, cfg: HarnessConfig, adapter: Adapter, key: tuple[str, str],
                     workdir: str, repo: Any) -> RunState:
        service = self._service
        name, run_id = key
        git = await trio.to_thread.run_sync(git_start, workdir) if repo is not None else (None, None, frozenset())
        branch, start_commit, dirty = git

        now = service.wall_clock()
        budget = cfg.timeout + self.kill_grace + self._record_budget() + self.token_grace
        token = await service.store.write(lambda db: graph.mint_run_token(
            db, harness=name, run_id=run_id, workdir=workdir, now=now, expires_at=now + timedelta(seconds=budget)))
        mcp_config: Path | None = None
        log = self._log.bind(harness=name, run=run_id, adapter=adapter.name)
        try:
            gateway = self._gateway_url()
            if gateway:
                mcp_config = await trio.to_thread.run_sync(
                    _write_mcp_config, config.store.path / "runs", gateway, token)
            plan = await prepare_spawn(_RunScope(service, config), harness=name, run_id=run_id, workdir=workdir,
                                       base_argv=())
            prompt = plan.argv[-1] if plan.argv else None
            spec = adapter.launch(LaunchRequest(
                harness=name, run_id=run_id, workdir=workdir, prompt=prompt, command=cfg.command,
                model=cfg.model, allowed_tools=cfg.allowed_tools, permission_mode=cfg.permission_mode,
                extra_args=cfg.extra_args, mcp_config_path=None if mcp_config is None else str(mcp_config),
                gateway_url=gateway, run_token=token))
            env = agent_env(config, os.environ)
            env.update(MEMACTORS_HARNESS=name, MEMACTORS_RUN_ID=run_id)
            if gateway:
                env.update(MEMACTORS_GATEWAY_URL=gateway, MEMACTORS_RUN_TOKEN=token)
            if mcp_config is not None:
                env["MEMACTORS_MCP_CONFIG"] = str(mcp_config)
            env.update(spec.env)
            prepared = _Prepared(cfg, adapter, spec.argv, env, workdir, None if repo is None else repo.key,
                                 None if repo is None else repo.toplevel, branch, start_commit, dirty, mcp_config)
            state = RunState(name, run_id, adapter.name, iso(now))
            assert self._nursery is not None
            self._active[key] = state
            await self._nursery.start(self._supervise, prepared, state)
        except BaseException:  # ok: undo the token and file of a run that never started, then re-raise
            self._active.pop(key, None)
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._release(name, run_id, mcp_config, now)
            raise
        log.bind(briefing="prepended" if plan.composed else (plan.skipped or "off"), repo=prepared.repo_key,
                 timeout_s=cfg.timeout).info("run started")
        return state

    async def _release(self, harness: str, run_id: str, mcp_config: Path | None, ended: datetime) -> None:
        """The run is over: its token expires after the grace and its MCP config file is removed."""
        expires = ended + timedelta(seconds=self.token_grace)
        await self._service.store.write(lambda db: graph.expire_run_tokens(
            db, harness=harness, run_id=run_id, at=expires))
        if mcp_config is not None:
            await trio.to_thread.run_sync(lambda: mcp_config.unlink(missing_ok=True))

    # -- supervise ----------------------------------------------------------------------------------------
    async def _supervise(self, run: _Prepared, state: RunState, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        log = self._log.bind(harness=state.harness, run=state.run_id)
        wall = self._service.wall_clock
        started_wall = wall()
        started = trio.current_time()
        parser = run.adapter.parser()
        code: int | None = None
        spawn_error: str | None = None
        try:
            proc = await trio.lowlevel.open_process(
                list(run.argv), cwd=run.workdir, env=run.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            spawn_error = type(exc).__name__
            state.error = f"{spawn_error}: {run.argv[0] if run.argv else ''}"
            proc = None
        task_status.started()
        try:
            if proc is None:
                log.bind(error=spawn_error, argv0=run.argv[0] if run.argv else "").warning("run could not spawn")
            else:
                code = await self._follow(proc, parser, run, state, wall)
        finally:
            if proc is not None and proc.returncode is None:  # cancelled from outside: never leave it running
                _kill_group(proc, signal.SIGKILL)
                with trio.CancelScope(shield=True), trio.move_on_after(self.kill_grace):
                    await proc.wait()
            ended_wall = wall()
            duration_ms = int((trio.current_time() - started) * 1000)
            with trio.CancelScope(shield=True), trio.move_on_after(self._record_budget()):
                await self._record(run, state, parser.transcript, code=code, spawn_error=spawn_error,
                                   started=started_wall, ended=ended_wall, duration_ms=duration_ms, log=log)

    async def _follow(self, proc: trio.Process, parser: StreamParser, run: _Prepared, state: RunState,
                      wall: Callable[[], datetime]) -> int:
        """Parse stdout as it streams until the process ends, the harness's ``timeout`` passes or the run
        is stopped; the deadline is this run's own cancel scope, which ``RunState.stop`` cancels."""
        pumped = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, proc.stdout, parser, wall, pumped)
            with trio.CancelScope(deadline=trio.current_time() + run.cfg.timeout) as scope:
                state.scope = scope
                if state.stop_reason is not None:
                    scope.cancel()
                await proc.wait()
            if scope.cancelled_caught:
                state.stop_reason = state.stop_reason or "deadline"
                _kill_group(proc, signal.SIGTERM)
                with trio.move_on_after(self.kill_grace):
                    await proc.wait()
                if proc.returncode is None:
                    _kill_group(proc, signal.SIGKILL)
                    await proc.wait()
            # Whatever the agent left in its process group goes with it, so stdout reaches EOF.
            _kill_group(proc, signal.SIGKILL)
            with trio.move_on_after(self.kill_grace):
                await pumped.wait()
            nursery.cancel_scope.cancel()
        assert proc.returncode is not None
        return proc.returncode

    # -- record -------------------------------------------------------------------------------------------
    async def _record(self, run: _Prepared, state: RunState, transcript: Transcript, *, code: int | None,
                      spawn_error: str | None, started: datetime, ended: datetime, duration_ms: int,
                      log: Any) -> None:
        key = (state.harness, state.run_id)
        try:
            changed: set[str] | None = None
            if run.toplevel is not None and spawn_error is None:
                changed = await trio.to_thread.run_sync(git_changed, run.toplevel, run.start_commit)
            record = build_run_record(
                harness=state.harness, adapter=run.adapter.name, run_id=state.run_id, cfg=run.cfg,
                transcript=transcript, exit_code=code, stopped=state.stop_reason if spawn_error is None else None,
                spawn_error=spawn_error is not None, started_at=iso(started), ended_at=iso(ended),
                duration_ms=duration_ms, workdir=run.workdir, repo_key=run.repo_key, toplevel=run.toplevel,
                branch=run.branch, changed=changed, dirty_at_start=run.dirty_at_start)
            state.outcome, state.reason, state.exit_code = record["outcome"], record["reason"], code
            try:
                result = await self._service.ingest_run(record, source=f"run {state.harness}/{state.run_id}",
                                                        harness_config=run.cfg)
                state.ingest = str(result.get("outcome"))
                state.episode_id = result.get("episode_id")
            except MemactorsError as exc:
                state.ingest = "rejected"
                log.bind(error=type(exc).__name__).error("run record rejected")
            log.bind(outcome=state.outcome, reason=state.reason, exit_code=code, edits=len(transcript.edits),
                     commands=len(transcript.commands), ingest=state.ingest, episode=state.episode_id,
                     duration_ms=duration_ms).info("run ended")
        finally:
            state.state = "ended"
            if state.outcome is None:
                state.outcome, state.reason = "crashed", "internal_error"
            self._active.pop(key, None)
            self._finished[key] = state
            while len(self._finished) > KEEP_FINISHED:
                self._finished.popitem(last=False)
            try:
                await self._release(state.harness, state.run_id, run.mcp_config, ended)
            finally:
                state.done.set()


# -- helpers (pure or off-loop) -------------------------------------------------------------------------

def _new_run_id(now: datetime) -> str:
    return f"r{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


async def _workdir(cfg: HarnessConfig, config: Config) -> str:
    if not cfg.workdir:
        raise InvalidArgument(f"[harness.{cfg.name}] workdir is required to run it", field="workdir",
                              harness=cfg.name)
    path = Path(cfg.workdir).expanduser()  # noqa: ASYNC240 -- reads $HOME, no I/O
    if not path.is_absolute() and config.global_path is not None:
        path = config.global_path.parent / path
    if not await trio.Path(path).is_dir():
        raise InvalidArgument(f"[harness.{cfg.name}] workdir = {cfg.workdir!r}: not a directory", field="workdir",
                              harness=cfg.name)
    return str(path)


def agent_env(config: Config, environ: Any) -> dict[str, str]:
    """The daemon's environment as the agent gets it: everything but the daemon's own secret, the
    ``[model_api] api_key_env`` variable (the utility model's key is the daemon's, not the agent's)."""
    env = dict(environ)
    if config.model_api is not None and config.model_api.api_key_env:
        env.pop(config.model_api.api_key_env, None)
    return env


def _write_mcp_config(directory: Path, gateway_url: str, token: str) -> Path:
    """Claude Code's ``--mcp-config`` JSON naming the gateway with this run's token; mode 0600."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"mcp-{secrets.token_hex(8)}.json"
    body = {"mcpServers": {"memactors": {"type": "http", "url": gateway_url,
                                         "headers": {"Authorization": f"Bearer {token}"}}}}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)
    return path


def _kill_group(proc: trio.Process, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def _pump(stream: Any, parser: StreamParser, wall: Callable[[], datetime], done: trio.Event) -> None:
    """Feed stdout to the parser one line at a time as it arrives; nothing is kept past the line."""
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
                parser.feed(line.decode("utf-8", "replace"), at=iso(wall()))
            if len(buffer) > MAX_LINE:
                buffer.clear()
                skipping = True
        if buffer and not skipping:
            parser.feed(bytes(buffer).decode("utf-8", "replace"), at=iso(wall()))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.set()
