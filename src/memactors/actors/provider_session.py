"""The provider session actor: the one MCP client session to the memory provider.

It owns the connection (in-process built-in server, stdio subprocess or streamable HTTP), checks
`memory_contract` when the session opens and after every reconnect, and serves record / recall /
forget / contract calls concurrently. Every call:

* runs under the *caller's* deadline, carried in the message (`ProviderCall.deadline`), so a hung call
  never blocks another caller and nobody waits past what they asked for;
* is refused without touching the provider while the session is down or incompatible, or while the
  breaker is open (`ProviderUnavailable` / `ProviderIncompatible`);
* has its response read (structured content, else one JSON text block) and validated against the
  shipped contract schemas; a response that fails as a whole is a provider error;
* is observed in `harness_memory_provider_duration_seconds{provider,op}` and written to the call log as
  the daemon's own row, with its arguments hashed (REQ-18).

A connection that closes (a subprocess that died) is noticed by the failing call or by the idle
heartbeat (a `memory_contract` call every `heartbeat` seconds), and the session reconnects with backoff;
the rest of the daemon only sees `ProviderUnavailable` meanwhile.

A stdio provider's replacement is started in advance. Once a connection is ready, a spare process of
the same command is started and left waiting at its stdin (an MCP server does nothing before
`initialize`); when the connection is lost, the next one uses it. Without it a killed provider was
back only after a new interpreter had imported its code: 3.5-4.5 s of the 4-6 s a `kill -9` cost on a
loaded 2-core machine, measured from connection lost to initialized (docs/benchmarks.md, "fault
injection"). A spare that exits on its own before use (a provider that takes an exclusive lock at
start, say) is not replaced: the session then starts each process when it needs it, as before.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import attrs
import mcp
import mcp.types as mt
import trio
from loguru import logger
from mcp.client.stdio import get_default_environment
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from .. import contract
from ..breaker import Breaker, Outcome
from ..errors import MemactorsError, ProviderIncompatible, ProviderTimeout, ProviderUnavailable
from ..metrics import Metrics
from ..provider_stderr import log_stderr
from ..store import Store, WallClock, iso, log_call, utc_now
from ..telemetry import guard_sdk_spans
from ..urls import mask_urls
from .call_log import CallLog
from .kernel import Address, Ask, Mailbox, open_mailbox, serve

SessionState = Literal["connecting", "ready", "incompatible", "down"]
#: Seconds between idle `memory_contract` checks (module-level so a real-time test can shorten it).
HEARTBEAT_SECONDS = 15.0
#: Consecutive heartbeat timeouts after which the connection is dropped and opened afresh (a hung stdio
#: provider is then replaced by a new process; an HTTP upstream gets a new connection).
HEARTBEAT_MISSES_TO_RECONNECT = 3
#: A stdio provider that closed its stdin is given this long to exit before SIGTERM to its process group,
#: and as long again before SIGKILL (the SDK's own stdio client waits the same).
STOP_GRACE = 2.0
OPS = {"memory_record_episode": "record", "memory_recall": "recall", "memory_forget": "forget",
       "memory_contract": "contract", contract.RECORD_MANY: "record"}

Target = Any  # mcp.server.Server | mcp.StdioServerParameters | str (URL)


@attrs.frozen
class ProviderCall(Ask[dict[str, Any]]):
    """Call one contract tool. `deadline` is the caller's (`trio.current_effective_deadline()`)."""

    tool: str
    arguments: dict[str, Any]
    deadline: float
    caller: str = "daemon"


@attrs.frozen
class GetStatus(Ask["ProviderStatus"]):
    """Ask for a `ProviderStatus` snapshot."""


@attrs.frozen
class ProviderStatus:
    provider: str
    state: SessionState
    contract: int | None
    provider_name: str | None
    provider_version: str | None
    breaker: str
    last_error: str | None
    since: float  # trio time of the last state change
    ever_checked: bool


class _ConnectionLost(Exception):
    """The transport closed under a call; the connection loop reconnects."""


class ProviderSession:
    """Owns the provider connection; address it with `ProviderCall` / `GetStatus` messages."""

    def __init__(
        self,
        *,
        provider: str,
        target: Callable[[], Target],
        store: Store,
        metrics: Metrics,
        provider_timeout: float,
        heartbeat: float | None = None,
        endpoint: str = "",
        max_backoff: float = 30.0,
        wall_clock: WallClock = utc_now,
        breaker: Breaker | None = None,
        on_ready: Callable[[], Awaitable[None]] | None = None,
        call_log: CallLog | None = None,
        export_spans: Callable[[], bool] = lambda: False,
        spare_process: Callable[[], bool] = lambda: True,
    ) -> None:
        self.provider = provider
        self._spare_process = spare_process  # `[mcp.<name>] spare_process`, read when a spare would start
        self._target = target
        self._store = store
        self._metrics = metrics
        self._provider_timeout = provider_timeout
        self._heartbeat = HEARTBEAT_SECONDS if heartbeat is None else heartbeat
        self._endpoint = endpoint or provider  # what an error names: the command's path or the URL
        self._attempted = False  # a connection attempt or contract check has failed at least once
        self._max_backoff = max_backoff
        self._wall_clock = wall_clock
        self.breaker = breaker or Breaker()
        self._on_ready = on_ready
        self._calls = call_log
        self._export_spans = export_spans
        self.address, self._mailbox = open_mailbox("provider_session", 64)
        self._client: mcp.Client | None = None
        self._state: SessionState = "connecting"
        self._since = 0.0
        self._info: contract.ProviderInfo | None = None
        self._last_error: str | None = None
        self._ever_checked = False
        self._lost = trio.Event()
        #: connections made so far, and the last one whose loss was reported to the breaker: one crash
        #: is one failure however many calls were in flight
        self._generation = 0
        self._failure_reported_for = -1
        #: the spare stdio process and the parameters it was started with (`spare_process`)
        self._standby: tuple[trio.Process, mcp.StdioServerParameters] | None = None
        self._standby_ok = True  # false once a spare exited before use: this provider cannot run twice
        self._spare_starting = False
        self._log = logger.bind(actor="provider_session", provider=provider)
        #: The provider runs in this process on the daemon's store (the built-in one): its failures while
        #: the store is unreachable are the store's, and the store coming back half-opens its breaker.
        self._in_process = False
        self._store_recoveries = store.recoveries

    @property
    def mailbox(self) -> Mailbox[Any]:
        return self._mailbox

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        self._since = trio.current_time()
        # The mcp SDK's own spans (one per request it sends) for this session's connection follow the
        # same consent as memory spans: every task started below inherits this context (REQ-18).
        guard_sdk_spans(self._export_spans)
        # One pipe for the session's life: every stdio provider process it starts writes its stderr
        # there, and a task logs it redacted, cut and rate-limited (never inherited by the daemon's own
        # stderr, where a provider's traceback could print a secret as is).
        read_fd, write_fd = os.pipe()
        self._errlog = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stderr_loop, read_fd)
                nursery.start_soon(self._connection_loop)
                task_status.started(self.address)
                await serve(self._mailbox, self._handle, concurrency=32, context=self._about)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._drop_standby()
            self._errlog.close()

    async def _stderr_loop(self, read_fd: int) -> None:
        await log_stderr(read_fd, self._log)

    # -- connection ---------------------------------------------------------------------------------
    def _set_state(self, state: SessionState, error: str | None = None) -> None:
        if state != self._state:
            self._log.bind(state=state, previous=self._state).info("provider session state")
            self._since = trio.current_time()
        self._state = state
        # Shown by status and doctor: a URL inside (an HTTP client's error names the one it called) is
        # shown without its credentials.
        self._last_error = None if error is None else mask_urls(error)
        self._update_up()

    def _update_up(self) -> None:
        # Absent before the first contract check (REQ-21) — but a failed connection attempt counts as a
        # failed check, so an alert on provider_up == 0 fires for a provider that never came up.
        if self._ever_checked or self._attempted:
            up = self._state == "ready" and not self.breaker.is_open
            self._metrics.set_provider_up(self.provider, up)

    async def _connection_loop(self) -> None:
        backoff = 0.25
        while True:
            self._lost = trio.Event()
            connect_budget = max(self._provider_timeout * 5, 10.0)
            try:
                with trio.CancelScope(deadline=trio.current_time() + connect_budget) as scope:
                    async with mcp.Client(self._transport(), raise_exceptions=False) as client:
                        self._client = client
                        self._generation += 1
                        await self._check(client)
                        scope.deadline = math.inf
                        backoff = 0.25
                        async with trio.open_nursery() as inner:
                            inner.start_soon(self._heartbeat_loop, client)
                            if self._state == "ready":
                                inner.start_soon(self._prepare_standby)
                            await self._lost.wait()
                            inner.cancel_scope.cancel()
                if scope.cancelled_caught:
                    self._attempted = True
                    self._set_state("down", f"{self._endpoint}: no answer to initialize or memory_contract "
                                            f"within {connect_budget:g} s")
                    self._log.bind(budget_s=connect_budget).warning("provider connection attempt timed out")
            except (MemactorsError, MCPError, OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    RuntimeError, ExceptionGroup) as exc:
                self._attempted = True
                reason = describe_failure(exc, self._endpoint)
                self._set_state("down", reason)
                self._log.bind(error=type(_leaf(exc)).__name__).warning("provider connection failed")
            finally:
                self._client = None
            if self._state == "ready":
                self._set_state("down", self._last_error or "connection lost")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff)

    def _transport(self) -> Target:
        target = self._target()
        self._in_process = not isinstance(target, (mcp.StdioServerParameters, str))
        if isinstance(target, mcp.StdioServerParameters):
            return self._stdio(target)
        return target

    @asynccontextmanager
    async def _stdio(self, params: mcp.StdioServerParameters) -> AsyncIterator[Any]:
        """The MCP transport to a stdio provider: the spare process when there is one for these
        parameters, else a new one."""
        process = await self._take_standby(params) or await self._spawn(params)
        lost = self._lost  # this connection's: a late EOF must not end the next one
        async with process_transport(process, on_eof=lost.set) as streams:
            yield streams

    async def _spawn(self, params: mcp.StdioServerParameters) -> trio.Process:
        # As the SDK's stdio client does: its own session (so the whole tree can be stopped), the default
        # environment plus the configured one, stderr to the session's redacting log pipe.
        return await trio.lowlevel.open_process(
            [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errlog,
            env=get_default_environment() | (params.env or {}), cwd=params.cwd, start_new_session=True)

    async def _take_standby(self, params: mcp.StdioServerParameters) -> trio.Process | None:
        if self._standby is None:
            return None
        process, started_with = self._standby
        self._standby = None
        if process.poll() is not None:
            # It exited before it was needed: this provider does not take a second process (a lock, a
            # port); start each one when it is needed from now on.
            self._standby_ok = False
            self._log.bind(pid=process.pid, returncode=process.returncode).warning(
                "spare provider process exited before use; no longer keeping one")
            return None
        if started_with != params:  # the configuration changed meanwhile
            await stop_process(process)
            return None
        return process

    async def _prepare_standby(self) -> None:
        """Start the spare process for the next connection, once per ready connection."""
        if (not self._standby_ok or self._standby is not None or self._spare_starting
                or not self._spare_process()):
            return
        target = self._target()
        if not isinstance(target, mcp.StdioServerParameters):
            return
        self._spare_starting = True  # a second caller during the spawn must not start another one
        try:
            process = await self._spawn(target)
        except OSError as exc:
            self._log.bind(error=type(exc).__name__).warning("spare provider process not started")
            return
        finally:
            self._spare_starting = False
        self._standby = (process, target)
        self._log.bind(pid=process.pid).debug("spare provider process started")

    async def _drop_standby(self) -> None:
        if self._standby is not None:
            process, _ = self._standby
            self._standby = None
            await stop_process(process)

    async def _check(self, client: mcp.Client) -> None:
        """memory_contract on open and after every reconnect: tools present, version supported."""
        try:
            with trio.fail_after(max(self._provider_timeout, 1.0) * 2):
                tools = await client.list_tools()
                missing = contract.missing_tools(t.name for t in tools.tools)
                if missing:
                    raise ProviderIncompatible(f"provider lacks {', '.join(missing)}", provider=self.provider)
                payload = await self._raw_call(client, "memory_contract", {})
                # Kept before the version check: status names the contract an incompatible provider spoke.
                self._info = contract.contract_info(payload, provider=self.provider)
                contract.check_supported(self._info, provider=self.provider)
        except ProviderIncompatible as exc:
            self._ever_checked = True
            self._set_state("incompatible", str(exc))
            return
        except trio.TooSlowError:
            self._ever_checked = True
            self._set_state("down", f"{self._endpoint}: memory_contract timed out")
            raise ProviderUnavailable("memory_contract timed out", provider=self.provider) from None
        except ProviderUnavailable as exc:
            self._ever_checked = True
            self._set_state("down", str(exc))
            raise
        self._ever_checked = True
        was = self._state
        if was != "ready":
            self.breaker.probe_now()  # a new process that passed its contract check may close the breaker
        self._set_state("ready")
        if was != "ready" and self._on_ready is not None:
            # The provider is (back) in service: let retention retry what waited for it, now.
            with trio.move_on_after(1.0):
                try:
                    await self._on_ready()
                except MemactorsError as exc:
                    self._log.bind(error=type(exc).__name__).warning("ready notification failed")

    async def _heartbeat_loop(self, client: mcp.Client) -> None:
        """An idle `memory_contract` every heartbeat. A check that times out or fails takes the session
        out of `ready` (calls are refused at once, provider_up drops to 0, doctor warns and, after five
        minutes, fails); the next one that passes puts it back. After a few timeouts in a row the
        connection is opened afresh."""
        misses = 0
        while True:
            await trio.sleep(self._heartbeat)
            if self._state in ("incompatible", "down"):
                try:
                    await self._check(client)  # "until a later check succeeds"
                    misses = 0
                except ProviderUnavailable:
                    misses += 1
                    if misses >= HEARTBEAT_MISSES_TO_RECONNECT or self._lost.is_set():
                        self._lost.set()
                        return
                continue
            budget = max(self._provider_timeout, 1.0)
            with trio.move_on_after(budget) as scope:
                try:
                    await self._raw_call(client, "memory_contract", {})
                    misses = 0
                    continue
                except _ConnectionLost:
                    self._lost.set()
                    return
                except MemactorsError as exc:
                    self._ever_checked = True
                    self._set_state("down", f"{self._endpoint}: memory_contract failed: {str(exc)[:200]}")
            if scope.cancelled_caught:
                self._ever_checked = True
                self._set_state("down", f"{self._endpoint}: memory_contract timed out after {budget:g} s")
                self._log.bind(timeout_s=budget).warning("provider heartbeat timed out")
            misses += 1

    async def _raw_call(self, client: mcp.Client, tool: str, arguments: dict[str, Any],
                        caller: str = "daemon") -> dict[str, Any]:
        op = OPS[tool]
        started = trio.current_time()
        outcome = "error"
        try:
            try:
                result = await client.call_tool(tool, arguments)
            except MCPError as exc:
                if exc.code == mt.CONNECTION_CLOSED:
                    self._lost.set()
                    raise _ConnectionLost() from exc
                raise contract.ProviderError(f"{tool} failed: {str(exc)[:200]}", provider=self.provider,
                                             tool=tool) from None
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel) as exc:
                self._lost.set()
                raise _ConnectionLost() from exc
            payload = contract.tool_result_payload(result, provider=self.provider, tool=tool)
            contract.validate_response(tool, payload, provider=self.provider)
            outcome = "ok"
            return payload
        except trio.Cancelled:
            outcome = "timeout"
            raise
        finally:
            elapsed = trio.current_time() - started
            self._metrics.observe_provider_call(self.provider, op, elapsed)
            await self._call_log(tool, arguments, outcome, elapsed, caller)

    async def _call_log(self, tool: str, arguments: dict[str, Any], outcome: str, elapsed: float, caller: str) -> None:
        at = iso(self._wall_clock())
        if self._calls is not None:  # batched, off the request path (the service always gives one)
            self._calls.record(at=at, caller=caller, server=self.provider, tool=tool, arguments=arguments,
                               outcome=outcome, duration_ms=int(elapsed * 1000))
            return

        def write(db: Any) -> None:
            log_call(db, at=at, caller=caller, server=self.provider, tool=tool, arguments=arguments,
                     outcome=outcome, duration_ms=int(elapsed * 1000))

        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await self._store.write(write)
            except Exception as exc:  # the call log must never fail a provider call
                self._log.bind(error=type(exc).__name__).warning("call log write failed")

    # -- requests -----------------------------------------------------------------------------------
    def _about(self, message: object) -> dict[str, object]:
        """What a failed request's log line names: the provider, and the contract tool it called."""
        if isinstance(message, ProviderCall):
            return {"provider": self.provider, "op": message.tool}
        return {"provider": self.provider}

    async def _handle(self, message: object) -> object:
        match message:
            case ProviderCall():
                return await self._call(message)
            case GetStatus():
                return self.status()
            case _:
                raise TypeError(f"provider_session cannot handle {type(message).__name__}")

    def status(self) -> ProviderStatus:
        return ProviderStatus(
            provider=self.provider, state=self._state,
            contract=self._info.contract if self._info else None,
            provider_name=self._info.name if self._info else None,
            provider_version=self._info.version if self._info else None,
            breaker=self.breaker.state, last_error=self._last_error, since=self._since,
            ever_checked=self._ever_checked,
        )

    async def _call(self, call: ProviderCall) -> dict[str, Any]:
        contract.check_request(call.tool, call.arguments)
        client = self._client
        if self._state == "incompatible":
            raise ProviderIncompatible("provider is incompatible", provider=self.provider, tool=call.tool)
        if client is None or self._state != "ready":
            raise ProviderUnavailable(f"provider is {self._state}", provider=self.provider, tool=call.tool)
        if self._in_process and self._store.recoveries != self._store_recoveries:
            # The store is back (a PostgreSQL failover ended): the built-in provider failed only because
            # the store did, so this call is the half-open probe now, not after the open time (30 s):
            # the first recall after the promotion succeeds (docs/fleet.md).
            self._store_recoveries = self._store.recoveries
            self.breaker.probe_now()
        if not self.breaker.allow():
            raise ProviderUnavailable("provider breaker is open", provider=self.provider, tool=call.tool)
        deadline = call.deadline
        started = trio.current_time()
        generation = self._generation
        if self.breaker.state == "half_open":  # the single probe runs under provider_timeout
            deadline = min(deadline, trio.current_time() + self._provider_timeout)
        verdict: Outcome = "neutral"
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                payload = await self._raw_call(client, call.tool, call.arguments, call.caller)
                verdict = "ok"
                return payload
            verdict = "timeout" if scope.cancelled_caught else "neutral"
            raise ProviderTimeout(call.tool, deadline - started, provider=self.provider)
        except _ConnectionLost:
            # One dead connection is one failure, not one per call that was in flight on it.
            verdict = "neutral" if self._failure_reported_for >= generation else "failure"
            self._failure_reported_for = max(self._failure_reported_for, generation)
            raise ProviderUnavailable(f"connection to the provider closed during {call.tool}",
                                      provider=self.provider, tool=call.tool) from None
        except ProviderUnavailable:
            if verdict == "neutral":
                verdict = "failure"
            raise
        finally:
            if (verdict in ("failure", "timeout") and self._in_process
                    and getattr(self._store, "last_error", None) is not None):
                verdict = "neutral"  # the store is unreachable: no verdict on the provider that reads it
            self.breaker.report(verdict)
            self._update_up()


@asynccontextmanager
async def process_transport(process: trio.Process, *,
                            on_eof: Callable[[], object] | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP transport (read stream, write stream) over a started stdio server process.

    Newline-delimited JSON-RPC over its stdin and stdout, read in chunks on trio's I/O loop. On exit the
    process is stopped (`stop_process`), whatever state it is in, shielded from cancellation. A closed
    or broken pipe ends the read stream, so the client session sees the connection close, and calls
    `on_eof`: a provider that died while nothing was in flight is noticed at once, not at the next
    heartbeat.
    """
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        async with read_writer:
            buffer = b""
            try:
                while chunk := await stdout.receive_some(1 << 16):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        message: SessionMessage | Exception
                        try:
                            message = SessionMessage(mt.jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as exc:  # a line that is not JSON-RPC: the session reports it
                            message = exc
                        await read_writer.send(message)
            except (trio.BrokenResourceError, trio.ClosedResourceError, anyio.BrokenResourceError,
                    anyio.ClosedResourceError, OSError):
                pass
            if on_eof is not None:
                on_eof()

    async def writer() -> None:
        try:
            async with write_reader:
                async for session_message in write_reader:
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await stdin.send_all(data.encode("utf-8"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await read_writer.aclose()  # the process is gone or going: end the session's reads too

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(process)
            nursery.cancel_scope.cancel()


async def stop_process(process: trio.Process) -> None:
    """Close a provider process's stdin (the MCP way to ask it to exit), give it STOP_GRACE seconds,
    then SIGTERM its process group and, STOP_GRACE later, SIGKILL it; reap it. A process that is already
    dead (killed) is reaped at once."""
    with trio.CancelScope(shield=True):
        if process.stdin is not None:
            try:
                await process.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, sig)
                except OSError:  # no such group any more: the process itself has just exited
                    pass
            with trio.move_on_after(STOP_GRACE):
                await process.wait()
            if process.returncode is not None:
                break
        if process.stdout is not None:
            await process.stdout.aclose()


async def provider_call(address: Address[Any], tool: str, arguments: dict[str, Any], *, caller: str = "daemon") -> dict[str, Any]:
    """Ask the provider session to call `tool` under the current task's effective deadline."""
    return await address.ask(ProviderCall(tool, arguments, trio.current_effective_deadline(), caller))


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) groups: what actually went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe_failure(exc: BaseException, endpoint: str) -> str:
    """A connection failure in words that name what could not be reached: the command's path that could
    not be started, or the URL (host:port) that refused — never just `ExceptionGroup`. A URL in the
    client's own message is shown without its credentials (``mask_urls``)."""
    leaf = _leaf(exc)
    if isinstance(leaf, OSError) and leaf.filename:
        return f"cannot start {leaf.filename}: {leaf.strerror or type(leaf).__name__}"
    if isinstance(leaf, OSError) and leaf.strerror:
        return f"cannot reach {endpoint}: {leaf.strerror}"
    detail = mask_urls(str(leaf))[:200] or type(leaf).__name__
    if type(leaf).__name__ == "ConnectError" or "connect" in detail.lower():
        return f"cannot connect to {endpoint}: {detail}"
    return f"{endpoint}: {type(leaf).__name__}: {detail}"
