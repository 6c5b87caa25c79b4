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
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import mcp
import mcp.types as mt
import trio
from loguru import logger
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from .. import contract
from .._kernel import Mailbox, open_mailbox, serve
from ..errors import MemactorsError, ProviderIncompatible, ProviderUnavailable
from ..metrics import Metrics
from ..redact import redact
from ..store import Store, WallClock, iso, log_call, utc_now
from ..telemetry import guard_sdk_spans
from .breaker import Breaker
from .call_log import CallLog

SessionState = Literal["connecting", "ready", "incompatible", "down"]
#: Seconds between idle `memory_contract` checks (module-level so a real-time test can shorten it).
HEARTBEAT_SECONDS = 15.0
#: Consecutive heartbeat timeouts after which the connection is dropped and opened afresh (a hung stdio
#: provider is then replaced by a new process; an HTTP upstream gets a new connection).
HEARTBEAT_MISSES_TO_RECONNECT = 3
#: A stdio provider's stderr: each line cut to this many characters, at most STDERR_LINES_PER_WINDOW
#: lines logged per STDERR_WINDOW seconds (the rest counted in one "suppressed" line).
STDERR_LINE_CHARS = 1000
STDERR_LINES_PER_WINDOW = 50
STDERR_WINDOW = 10.0
OPS = {"memory_record_episode": "record", "memory_recall": "recall", "memory_forget": "forget",
       "memory_contract": "contract"}

Target = Any  # mcp.server.Server | mcp.StdioServerParameters | str (URL)


@attrs.frozen
class ProviderCall:
    """Call one contract tool. `deadline` is the caller's (`trio.current_effective_deadline()`)."""

    tool: str
    arguments: dict[str, Any]
    deadline: float
    caller: str = "daemon"


@attrs.frozen
class GetStatus:
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
    ) -> None:
        self.provider = provider
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
        self._log = logger.bind(actor="provider_session", provider=provider)

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
                await serve(self._mailbox, self._handle, concurrency=32)
                nursery.cancel_scope.cancel()
        finally:
            self._errlog.close()

    async def _stderr_loop(self, read_fd: int) -> None:
        await log_stderr(read_fd, self._log)

    # -- connection ---------------------------------------------------------------------------------
    def _set_state(self, state: SessionState, error: str | None = None) -> None:
        if state != self._state:
            self._log.bind(state=state, previous=self._state).info("provider session state")
            self._since = trio.current_time()
        self._state = state
        self._last_error = error
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
        if isinstance(target, mcp.StdioServerParameters):
            return stdio_client(target, errlog=self._errlog)
        return target

    async def _check(self, client: mcp.Client) -> None:
        """memory_contract on open and after every reconnect: tools present, version supported."""
        try:
            with trio.fail_after(max(self._provider_timeout, 1.0) * 2):
                tools = await client.list_tools()
                missing = contract.missing_tools(t.name for t in tools.tools)
                if missing:
                    raise ProviderIncompatible(f"provider lacks {', '.join(missing)}", provider=self.provider)
                payload = await self._raw_call(client, "memory_contract", {})
                self._info = contract.check_contract(payload, provider=self.provider)
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
        if not self.breaker.allow():
            raise ProviderUnavailable("provider breaker is open", provider=self.provider, tool=call.tool)
        deadline = call.deadline
        generation = self._generation
        if self.breaker.state == "half_open":  # the single probe runs under provider_timeout
            deadline = min(deadline, trio.current_time() + self._provider_timeout)
        verdict = "neutral"
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                payload = await self._raw_call(client, call.tool, call.arguments, call.caller)
                verdict = "ok"
                return payload
            verdict = "timeout" if scope.cancelled_caught else "neutral"
            raise ProviderUnavailable(f"{call.tool} timed out", provider=self.provider, tool=call.tool)
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
            self.breaker.report(verdict)  # type: ignore[arg-type]
            self._update_up()


async def provider_call(address: Any, tool: str, arguments: dict[str, Any], *, caller: str = "daemon") -> dict[str, Any]:
    """Ask the provider session to call `tool` under the current task's effective deadline."""
    return await address.ask(ProviderCall(tool, arguments, trio.current_effective_deadline(), caller))


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) groups: what actually went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe_failure(exc: BaseException, endpoint: str) -> str:
    """A connection failure in words that name what could not be reached: the command's path that could
    not be started, or the URL (host:port) that refused — never just `ExceptionGroup`."""
    leaf = _leaf(exc)
    if isinstance(leaf, OSError) and leaf.filename:
        return f"cannot start {leaf.filename}: {leaf.strerror or type(leaf).__name__}"
    if isinstance(leaf, OSError) and leaf.strerror:
        return f"cannot reach {endpoint}: {leaf.strerror}"
    detail = str(leaf)[:200] or type(leaf).__name__
    if type(leaf).__name__ == "ConnectError" or "connect" in detail.lower():
        return f"cannot connect to {endpoint}: {detail}"
    return f"{endpoint}: {type(leaf).__name__}: {detail}"


async def log_stderr(read_fd: int, logger_: Any) -> None:
    """Read a provider's stderr from `read_fd` (owned and closed here) until EOF or cancellation and log
    each line redacted, cut to STDERR_LINE_CHARS and rate-limited, tagged `source=provider_stderr`."""
    log = logger_.bind(source="provider_stderr")
    stream = trio.lowlevel.FdStream(read_fd)
    async with stream:
        buffer = b""
        window_end, logged, suppressed = 0.0, 0, 0
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > STDERR_LINE_CHARS * 4:  # a line that never ends is cut, not buffered
                lines.append(buffer)
                buffer = b""
            for raw in lines:
                now = trio.current_time()
                if now >= window_end:
                    if suppressed:
                        log.bind(suppressed=suppressed).warning("provider stderr lines suppressed")
                    window_end, logged, suppressed = now + STDERR_WINDOW, 0, 0
                if logged >= STDERR_LINES_PER_WINDOW:
                    suppressed += 1
                    continue
                text = redact(raw.decode("utf-8", "replace").rstrip("\r"))
                if text.strip():
                    logged += 1
                    log.bind(line=text[:STDERR_LINE_CHARS], chars=len(text)).info("provider stderr")
