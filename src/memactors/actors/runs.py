"""The runs actor: the daemon runs ``[harness.<name>]`` one-shots with real agent CLIs and records them.

``StartRun`` (``memactors run <harness>``) prepares a run and starts one task for it in the actor's
nursery, which owns the child process, its deadline and the run record written when it ends:

1. **Prepare** (in the actor, off the loop for git and files): the harness's ``workdir``, its repository
   and branch; the repository's project ``harness.toml`` loaded over the global configuration as a
   project file (so REQ-1/8/16's project-file rules hold for a run; its caps may only lower the global
   ones, and it may turn recording off but never back on); the prompt (``--prompt`` overrides the configured one for this run only); the run's bearer
   token (expiring with the run); a per-run ``--mcp-config`` file (mode 0600, state directory, deleted
   after the run); then ``prepare_spawn`` computes the briefing and composes the prompt (REQ-16:
   exposure before spawn, the argument limit, the skip WARN and metric). The adapter turns all that
   into argv and environment.
2. **Supervise**: the process runs in the workdir in its own process group. Its stdout is parsed line
   by line as it streams by the adapter's parser and never kept; each line's effect becomes an event of
   the run's log (``run_watch``: redacted, bounded), and the reported turns and cost are checked
   against the harness's caps. Its stderr is drained and its last 4 KiB kept. After
   ``[harness.<name>] timeout`` the group gets SIGTERM, then SIGKILL after a grace: outcome
   ``timed_out``, reason ``deadline``. ``CancelRun`` (``memactors runs cancel``) and stopping the daemon
   stop it the same way: outcome ``cancelled``, reason ``operator_cancel``; a cap passed: ``cancelled``,
   ``budget_exceeded``. Every stopped run is still recorded.
3. **Record**: the run record is built from what happened (``agents/run_record.py``'s rules) and sent down
   ``IngestRun``'s path, so the episode appears as soon as the process ends. The run's row in the store
   (``store.agent_runs``: written at spawn, rewritten at the end with the redacted stderr tail and event log)
   keeps it listable after a restart. The token then expires after a short grace.

The composed prompt exists only in the child's argv: it is never logged, stored or sent anywhere (what
the agent echoes of it is scrubbed of the operator's prompt and the fence's nonce, ``run_watch.PromptScrub``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

import attrs
import trio
from loguru import logger

from ..adapters import Adapter, LaunchRequest, StreamParser, get_adapter
from ..agents.run_process import (
    agent_env,
    drain,
    feed_stdin,
    kill_group,
    kill_orphan,
    pump_lines,
    remove_mcp_configs,
    write_mcp_config,
)
from ..agents.run_record import StopReason, build_run_record, cap_reached, git_changed, git_start
from ..agents.run_state import RunState
from ..agents.run_watch import PromptScrub, RunWatch
from ..config import Config, HarnessConfig, load_config
from ..errors import InvalidArgument, MemactorsError, UnknownRun, exit_status
from ..metrics import Metrics
from ..redact import redact, redact_tail
from ..repo import resolve_repo
from ..store import Db, Store, WallClock, agent_runs, iso, run_tokens
from ..view import View
from .briefing import Briefing, BriefingAnswer, Delivery
from .kernel import Ask, open_mailbox, serve
from .spawn import SpawnPort, prepare_spawn

__all__ = ["CancelRun", "FindRun", "ListRuns", "RunState", "Runs", "RunsPort", "StartRun", "build_run_record",
           "exit_status"]


# -- messages -------------------------------------------------------------------------------------------

@attrs.frozen
class StartRun(Ask["RunState"]):
    """Start a run of ``harness``; ``prompt`` replaces the configured prompt for this run only."""

    harness: str
    prompt: str | None = None
    run_id: str | None = None


@attrs.frozen
class FindRun(Ask["RunState"]):
    """A run this daemon started (running, or ended: in memory or in the store); ``harness`` narrows a
    run id that more than one harness used."""

    run_id: str
    harness: str | None = None


@attrs.frozen
class ListRuns(Ask[dict[str, Any]]):
    """Runs newest first, optionally of one harness and in one state (``running`` or ``ended``)."""

    harness: str | None = None
    state: Literal["running", "ended"] | None = None
    limit: int = 50
    after: str | None = None


@attrs.frozen
class CancelRun(Ask["RunState"]):
    """Stop a running run the way a deadline does (SIGTERM, grace, SIGKILL); it is still recorded, as
    ``cancelled`` / ``operator_cancel``. Answers at once with the run's state (an ended run as it is)."""

    run_id: str
    harness: str | None = None


#: SIGTERM to SIGKILL.
KILL_GRACE = 5.0
#: A run token stays valid this long after its run ended (for a record the agent is still writing).
TOKEN_GRACE = 30.0
#: Finished runs kept in memory for WaitRun (older ones are read from the store).
KEEP_FINISHED = 256
#: How often old run rows and logs are pruned (checked when a run ends, and at start).
PRUNE_EVERY = timedelta(hours=1)


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
    #: What the agent reads on stdin (the adapter's ``LaunchSpec.stdin``); None: /dev/null.
    stdin: str | None = None


class RunsPort(SpawnPort, Protocol):
    """What the runs actor needs of the service, and all it may use: `SpawnPort`'s members (the
    configuration, store, metrics and briefing a run's spawn needs), the wall clock, and the ingest path
    a finished run's record goes down (``service.MemoryService`` is one; the checker proves it there)."""

    @property
    def wall_clock(self) -> WallClock: ...

    async def ingest_run(self, data: Any, *, source: str = "record",
                         harness_config: HarnessConfig | None = None) -> dict[str, Any]: ...


@attrs.frozen
class _RunScope:
    """What ``prepare_spawn`` reads for one run: the service's port, with the run's configuration
    (project file merged) in place of the daemon's."""

    port: RunsPort
    config: Config

    @property
    def store(self) -> Store:
        return self.port.store

    @property
    def metrics(self) -> Metrics:
        return self.port.metrics

    @property
    def briefing(self) -> Briefing:
        return self.port.briefing

    async def agent_briefing(self, view: View, *, delivery: Delivery, refresh: bool = False,
                             call_id: str | None = None, episodes_deadline: float | None = None) -> BriefingAnswer:
        return await self.port.agent_briefing(view, delivery=delivery, refresh=refresh, call_id=call_id,
                                              episodes_deadline=episodes_deadline)


# -- the actor ------------------------------------------------------------------------------------------

class Runs:
    """Owns every run it starts: one task per run in its nursery (docs/runs.md)."""

    def __init__(self, service: RunsPort, *, gateway_url: Callable[[], str | None], kill_grace: float = KILL_GRACE,
                 token_grace: float = TOKEN_GRACE) -> None:
        self._service = service
        self._gateway_url = gateway_url
        self.kill_grace = kill_grace
        self.token_grace = token_grace
        self._active: dict[tuple[str, str], RunState] = {}
        self._starting: set[tuple[str, str]] = set()
        self._finished: OrderedDict[tuple[str, str], RunState] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._pruned_at: datetime | None = None
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
        await self._reap()
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

    async def _handle(self, message: object) -> Any:
        match message:
            case StartRun():
                return await self._start(message)
            case FindRun(run_id=run_id, harness=harness):
                return await self._find(run_id, harness)
            case CancelRun(run_id=run_id, harness=harness):
                state = await self._find(run_id, harness)
                if state.state == "running":
                    if state.watch is not None:
                        state.watch.note("daemon", iso(self._service.wall_clock()), text="cancel asked: stopping")
                    self._log.bind(harness=state.harness, run=state.run_id).info("run cancel asked")
                    state.stop("cancel")
                return state
            case ListRuns():
                return await self._list(message)
            case _:
                raise TypeError(f"runs cannot handle {type(message).__name__}")

    async def _find(self, run_id: str, harness: str | None) -> RunState:
        """A running run from memory; an ended one from the store, which is the truth once its row is
        rewritten at the end (a forget since then has removed its stderr tail and log there)."""
        def matches(key: tuple[str, str]) -> bool:
            return key[1] == run_id and (harness is None or key[0] == harness)

        live = [s for key, s in self._active.items() if matches(key)]
        stored = await self._service.store.read(lambda db: agent_runs.find(db, run_id, harness))
        names = sorted({s.harness for s in live} | {v["harness"] for v in stored})
        if len(names) > 1:
            raise InvalidArgument(f"run {run_id} exists for harnesses {', '.join(names)}: name one with --harness",
                                  field="harness", run=run_id)
        if live:
            return live[0]
        if stored and stored[0]["state"] == "ended":
            return RunState.ended_from(stored[0])
        finished = [s for key, s in self._finished.items() if matches(key)]  # its row could not be written
        if finished:
            return finished[-1]
        whose = f" of harness {harness}" if harness else ""
        raise UnknownRun(f"no run {run_id}{whose} started by this daemon", harness=harness, run=run_id)

    async def _list(self, query: ListRuns) -> dict[str, Any]:
        views, total, cursor = await self._service.store.read(lambda db: agent_runs.page(
            db, harness=query.harness, state=query.state, limit=query.limit, after=query.after))
        live = {(v["harness"], v["run_id"]): {**v, "stderr_tail": None}
                for v in (s.view() for s in self._active.values())}
        return {"runs": [live.get((v["harness"], v["run_id"]), v) for v in views], "total": total,
                "next_cursor": cursor}

    async def _reap(self) -> None:
        """At start: a run of this host still ``running`` in the store belonged to a daemon that died
        mid-run. Its agent is killed if it still runs (proved by its environment), and the run is marked
        ended, crashed, so nothing runs unwatched and nothing stays ``running`` forever. Stale MCP config
        files go too. (Another host's running runs are its daemon's.)"""
        service = self._service
        host = socket.gethostname()
        stale = [v for v in await service.store.read(agent_runs.stale_running) if v.get("host", host) == host]
        now = service.wall_clock()
        for view in stale:
            fate = "gone" if view.get("pid") is None else await trio.to_thread.run_sync(
                kill_orphan, view["pid"], view["harness"], view["run_id"])
            view.update(state="ended", ended_at=iso(now), outcome="crashed", reason="internal_error",
                        error=f"the daemon stopped while the run was running (its agent: {fate})")

            def mark(db: Db, v: dict[str, Any] = view) -> None:
                agent_runs.upsert(db, v)

            await service.store.write(mark)
            self._log.bind(harness=view["harness"], run=view["run_id"], agent=fate).warning(
                "run left running by a previous daemon marked crashed")
        await trio.to_thread.run_sync(remove_mcp_configs, service.config.store.path / "runs")
        await self._prune(now)

    async def _prune(self, now: datetime) -> None:
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        rows, logs = await self._service.store.write(lambda db: agent_runs.prune(db, now))
        if rows or logs:
            self._log.bind(rows=rows, logs=logs).info("old runs pruned")

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
                # project-only upstreams) are checked here, and its keys apply to this run, but a cap it
                # sets may only lower the global one (a project cannot lift the operator's limit).
                config = await trio.to_thread.run_sync(
                    lambda: load_config(config.global_path, project_files=[project]))
                cfg, refused = _narrowed(cfg, config.harness[name])
                for refused_key in refused:
                    # REQ-8: the key is accepted in a project file because turning it off only narrows; a
                    # `true` over the operator's `false` would widen, so it is ignored, and said once per run.
                    self._log.bind(harness=name, file=str(project), key=f"[harness.{name}] {refused_key}").warning(
                        f"{project}: [harness.{name}] {refused_key} = true ignored: the global configuration turned it"
                        " off, and a project file may only turn recording off")
                config = attrs.evolve(config, harness=MappingProxyType({**config.harness, name: cfg}))
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
        token = await service.store.write(lambda db: run_tokens.mint_run_token(
            db, harness=name, run_id=run_id, workdir=workdir, now=now, expires_at=now + timedelta(seconds=budget)))
        mcp_config: Path | None = None
        log = self._log.bind(harness=name, run=run_id, adapter=adapter.name)
        try:
            gateway = self._gateway_url()
            if gateway:
                mcp_config = await trio.to_thread.run_sync(
                    write_mcp_config, config.store.path / "runs", gateway, token, adapter)
            plan = await prepare_spawn(_RunScope(service, config), harness=name, run_id=run_id, workdir=workdir,
                                       base_argv=())
            prompt = plan.argv[-1] if plan.argv else None
            spec = adapter.launch(LaunchRequest(
                harness=name, run_id=run_id, workdir=workdir, prompt=prompt, command=cfg.command,
                model=cfg.model, allowed_tools=cfg.allowed_tools, permission_mode=cfg.permission_mode,
                extra_args=cfg.extra_args, mcp_config_path=None if mcp_config is None else str(mcp_config),
                gateway_url=gateway, run_token=token, max_turns=cfg.max_turns, max_cost_usd=cfg.max_cost_usd))
            env = agent_env(config, os.environ)
            env.update(MEMACTORS_HARNESS=name, MEMACTORS_RUN_ID=run_id)
            if gateway:
                env.update(MEMACTORS_GATEWAY_URL=gateway, MEMACTORS_RUN_TOKEN=token)
            if mcp_config is not None:
                env["MEMACTORS_MCP_CONFIG"] = str(mcp_config)
            env.update(spec.env)
            prepared = _Prepared(cfg, adapter, spec.argv, env, workdir, None if repo is None else repo.key,
                                 None if repo is None else repo.toplevel, branch, start_commit, dirty, mcp_config,
                                 spec.stdin)
            scrub = await trio.to_thread.run_sync(PromptScrub, plan.prompt, prompt)  # redacts the prompt: off the loop
            state = RunState(name, run_id, adapter.name, iso(now), max_turns=cfg.max_turns,
                             max_cost_usd=cfg.max_cost_usd, watch=RunWatch(scrub=scrub))
            assert self._nursery is not None
            self._active[key] = state
            await self._nursery.start(self._supervise, prepared, state)
        except BaseException:  # ok: undo the token and file of a run that never started, then re-raise
            self._active.pop(key, None)
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._release(name, run_id, mcp_config, now)
            raise
        log.bind(briefing="prepended" if plan.composed else (plan.skipped or "off"), repo=prepared.repo_key,
                 timeout_s=cfg.timeout, pid=state.pid, max_turns=cfg.max_turns,
                 max_cost_usd=cfg.max_cost_usd).info("run started")
        return state

    async def _release(self, harness: str, run_id: str, mcp_config: Path | None, ended: datetime) -> None:
        """The run is over: its token expires after the grace and its MCP config file is removed."""
        expires = ended + timedelta(seconds=self.token_grace)
        await self._service.store.write(lambda db: run_tokens.expire_run_tokens(
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
        self._service.metrics.run_started(state.harness)
        parser = run.adapter.parser()
        code: int | None = None
        spawn_error: str | None = None
        try:
            proc = await trio.lowlevel.open_process(
                list(run.argv), cwd=run.workdir, env=run.env,
                stdin=subprocess.DEVNULL if run.stdin is None else subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
            state.pid = proc.pid
        except OSError as exc:
            spawn_error = type(exc).__name__
            state.error = f"{spawn_error}: {run.argv[0] if run.argv else ''}"
            proc = None
        try:
            # The row exists before StartRun answers, so `runs list` shows the run from its first moment.
            with trio.CancelScope(shield=True), trio.move_on_after(self._record_budget()):
                await self._service.store.write(lambda db: agent_runs.upsert(db, state.view()))
        except MemactorsError as exc:  # not fatal: the run goes on; its end rewrites the row
            log.bind(error=type(exc).__name__).warning("run row not written at spawn")
        task_status.started()
        try:
            if proc is None:
                log.bind(error=spawn_error, argv0=run.argv[0] if run.argv else "").warning("run could not spawn")
            else:
                code = await self._follow(proc, parser, run, state, wall)
        finally:
            if proc is not None and proc.returncode is None:  # cancelled from outside: never leave it running
                kill_group(proc, signal.SIGKILL)
                with trio.CancelScope(shield=True), trio.move_on_after(self.kill_grace):
                    await proc.wait()
            ended_wall = wall()
            duration_ms = int((trio.current_time() - started) * 1000)
            with trio.CancelScope(shield=True), trio.move_on_after(self._record_budget()):
                await self._record(run, state, parser, code=code, spawn_error=spawn_error,
                                   started=started_wall, ended=ended_wall, duration_ms=duration_ms, log=log)

    async def _follow(self, proc: trio.Process, parser: StreamParser, run: _Prepared, state: RunState,
                      wall: Callable[[], datetime]) -> int:
        """Parse stdout as it streams until the process ends, the harness's ``timeout`` passes or the run
        is stopped (a cancel, the daemon stopping, a cap); the deadline is this run's own cancel scope,
        which ``RunState.stop`` cancels."""
        watch = state.watch
        assert watch is not None and proc.stdout is not None and proc.stderr is not None

        def on_line(line: str) -> None:
            at = iso(wall())
            parser.feed(line, at=at)
            t = parser.transcript
            watch.after_line(line, t, at)
            state.turns, state.cost_usd = t.turns or None, t.cost_usd
            if state.stop_reason is not None or cap_reached(None, t) is not None:
                return  # already stopping, or the agent stopped itself at the cap it was given
            cfg = run.cfg
            if cfg.max_turns is not None and t.turns > cfg.max_turns:
                self._cap(state, "max_turns", at, f"{t.turns} turns passed max_turns = {cfg.max_turns}")
            elif cfg.max_cost_usd is not None and t.cost_usd is not None and t.cost_usd > cfg.max_cost_usd:
                self._cap(state, "max_cost_usd", at,
                          f"reported cost ${t.cost_usd:g} passed max_cost_usd = {cfg.max_cost_usd:g}")

        pumped = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_lines, proc.stdout, on_line, pumped)
            nursery.start_soon(drain, proc.stderr, watch.stderr.feed)
            if proc.stdin is not None and run.stdin is not None:
                nursery.start_soon(feed_stdin, proc.stdin, run.stdin)
            with trio.CancelScope(deadline=trio.current_time() + run.cfg.timeout) as scope:
                state.scope = scope
                if state.stop_reason is not None:
                    scope.cancel()
                await proc.wait()
            if scope.cancelled_caught:
                state.stop_reason = state.stop_reason or "deadline"
                kill_group(proc, signal.SIGTERM)
                with trio.move_on_after(self.kill_grace):
                    await proc.wait()
                if proc.returncode is None:
                    kill_group(proc, signal.SIGKILL)
                    await proc.wait()
            # Whatever the agent left in its process group goes with it, so stdout reaches EOF.
            kill_group(proc, signal.SIGKILL)
            with trio.move_on_after(self.kill_grace):
                await pumped.wait()
            nursery.cancel_scope.cancel()
        assert proc.returncode is not None
        return proc.returncode

    def _cap(self, state: RunState, cap: StopReason, at: str, why: str) -> None:
        """The agent's reported turns or cost passed the harness's cap: stop the run (it is recorded as
        cancelled / budget_exceeded, the cap named)."""
        assert state.watch is not None
        state.watch.note("daemon", at, text=f"{why}: stopping the run")
        self._log.bind(harness=state.harness, run=state.run_id, cap=cap, turns=state.turns,
                       cost_usd=state.cost_usd).warning("run passed its cap; stopping it")
        state.stop(cap)

    # -- record -------------------------------------------------------------------------------------------
    async def _record(self, run: _Prepared, state: RunState, parser: StreamParser, *, code: int | None,
                      spawn_error: str | None, started: datetime, ended: datetime, duration_ms: int,
                      log: Any) -> None:
        key = (state.harness, state.run_id)
        transcript = parser.transcript
        watch = state.watch
        assert watch is not None
        events: list[dict[str, Any]] = []
        try:
            tail = watch.stderr.text()
            scrub = watch.scrub
            if tail is not None:  # redacted off the loop, then scrubbed: never a line of the operator's prompt
                state.stderr_tail = await trio.to_thread.run_sync(lambda: scrub.thorough(redact_tail(tail)))
            if scrub.prompt is not None and transcript.result_text:
                # An agent that echoes its prompt (a `command` agent printing its argument) would put the
                # operator's prompt and the fence's nonce into the record and the episode's excerpt (REQ-5,
                # REQ-16). Redacted first (the record is redacted again at ingest: a no-op), so the scrub
                # never splits a credential; a briefing line the answer repeats is the answer.
                result = transcript.result_text
                transcript.result_text = await trio.to_thread.run_sync(lambda: scrub.thorough(redact(result)))
            events, state.log_dropped = list(watch.events), watch.dropped
            changed: set[str] | None = None
            if run.toplevel is not None and spawn_error is None:
                changed = await trio.to_thread.run_sync(git_changed, run.toplevel, run.start_commit)
            stopped = state.stop_reason if spawn_error is None else None
            record = build_run_record(
                harness=state.harness, adapter=run.adapter.name, run_id=state.run_id, cfg=run.cfg,
                transcript=transcript, exit_code=code, stopped=stopped, spawn_error=spawn_error is not None,
                started_at=iso(started), ended_at=iso(ended), duration_ms=duration_ms, workdir=run.workdir,
                repo_key=run.repo_key, toplevel=run.toplevel, branch=run.branch, changed=changed,
                dirty_at_start=run.dirty_at_start, output=watch.lines > 0)
            state.outcome, state.reason, state.exit_code = record["outcome"], record["reason"], code
            state.cap = cap_reached(stopped, transcript) if record["reason"] == "budget_exceeded" else None
            watch.note("end", iso(ended), text=f"{state.outcome} ({state.reason}), exit status {code}")
            try:
                ingested = await self._service.ingest_run(record, source=f"run {state.harness}/{state.run_id}",
                                                          harness_config=run.cfg)
                state.ingest = str(ingested.get("outcome"))
                state.episode_id = ingested.get("episode_id")
            except MemactorsError as exc:
                state.ingest = "rejected"
                log.bind(error=type(exc).__name__).error("run record rejected")
            log.bind(outcome=state.outcome, reason=state.reason, cap=state.cap, exit_code=code,
                     edits=len(transcript.edits), commands=len(transcript.commands), turns=state.turns,
                     cost_usd=state.cost_usd, stderr_bytes=watch.stderr.total, stdout_lines=watch.lines,
                     ingest=state.ingest, episode=state.episode_id, duration_ms=duration_ms).info("run ended")
        finally:
            state.state = "ended"
            state.ended_at, state.duration_ms = iso(ended), max(0, duration_ms)
            if state.outcome is None:
                state.outcome, state.reason = "crashed", "internal_error"
            with contextlib.suppress(ValueError):  # REQ-5 outcomes only; a metric never fails a run
                self._service.metrics.run_ended(state.harness, str(state.outcome), duration_ms / 1000)
            try:
                # Rewritten before the run leaves _active, so a lookup always finds it in one place.
                await self._service.store.write(lambda db: agent_runs.upsert(
                    db, state.view(), stderr_tail=state.stderr_tail, log=events))
            finally:
                self._active.pop(key, None)
                self._finished[key] = state
                while len(self._finished) > KEEP_FINISHED:
                    self._finished.popitem(last=False)
                try:
                    await self._release(state.harness, state.run_id, run.mcp_config, ended)
                    await self._prune(ended)
                finally:
                    state.watch = None  # its events are in the store now; followers read them there
                    watch.close()
                    state.done.set()


# -- helpers (pure or off-loop) -------------------------------------------------------------------------

def _new_run_id(now: datetime) -> str:
    return f"r{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


#: Harness keys a project file may turn off but never on (REQ-8: `memory_record`, and `record_trace`,
#: which gates recording the same way); `memory_briefing` and `untrusted_inline` are global-only.
NARROW_ONLY_KEYS = ("memory_record", "record_trace")


def _narrowed(global_cfg: HarnessConfig, merged: HarnessConfig) -> tuple[HarnessConfig, tuple[str, ...]]:
    """The harness as a run sees it with its project file merged: a cap only lowered, recording only
    turned off. Returns it with the keys the project file tried to turn back on (each ignored)."""
    refused = tuple(key for key in NARROW_ONLY_KEYS if getattr(merged, key) and not getattr(global_cfg, key))
    turned_off: dict[str, Any] = {key: False for key in refused}
    return attrs.evolve(merged, max_turns=_lower(global_cfg.max_turns, merged.max_turns),
                        max_cost_usd=_lower(global_cfg.max_cost_usd, merged.max_cost_usd), **turned_off), refused


def _lower(global_cap: Any, project_cap: Any) -> Any:
    """The cap in force when a project file sets one too: the lower, so a project only narrows."""
    if global_cap is None or project_cap is None:
        return global_cap if project_cap is None else project_cap
    return min(global_cap, project_cap)


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
