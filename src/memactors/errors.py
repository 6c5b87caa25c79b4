"""Errors of memactors: one base class and the sentinels SPEC-0030 "Error Handling Standards" names.

Every layer wraps what it raises with context (provider, harness, run, episode id) through the
keyword fields below, so a log line or an RPC error can name them without parsing a message.
"""

from __future__ import annotations

from collections.abc import Callable


class MemactorsError(Exception):
    """Raised for every failure memactors reports on purpose; the base of all sentinels."""

    #: gRPC code name used when this error crosses the operator RPC.
    code = "INTERNAL"
    #: Code word an MCP tool error of the gateway starts with (``<mcp_code>: <message>``, isError).
    mcp_code = "internal"

    def __init__(self, message: str = "", **context: object) -> None:
        self.message = message or (self.__doc__ or self.__class__.__name__).strip().splitlines()[0]
        self.context = {k: v for k, v in context.items() if v is not None}
        super().__init__(self.message)

    def __str__(self) -> str:
        if not self.context:
            return self.message
        where = " ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.message} ({where})"


class ConfigError(MemactorsError):
    """Raised when a configuration file cannot be loaded; names the file, the key and the value.

    The value is kept with every URL in it masked (``urls.mask_values``) and the message and context
    redacted (``redact.redact_config_error``): it is printed and logged with the error, and an
    upstream's URL or a misplaced key may carry a password, a key or a token.
    """

    code = "INVALID_ARGUMENT"

    def __init__(self, message: str = "", **context: object) -> None:
        from .redact import redact_config_error  # lazily: redact imports this module

        if "value" in context:
            from .urls import mask_values

            context["value"] = mask_values(context["value"])
        # The message and every context value through the shared redactor too: a config
        # file's rejected value, or a parser's message quoting a line, may hold a credential.
        message, context = redact_config_error(message, context)
        super().__init__(message, **context)


class InvalidArgument(MemactorsError):
    """Raised when a request or record is malformed; the message names the offending field.

    The rejected value itself is never part of the message (it may be a secret or megabytes long): a
    ``value=`` context is accepted for callers' convenience and dropped.
    """

    code = "INVALID_ARGUMENT"
    mcp_code = "invalid_argument"

    def __init__(self, message: str = "", **context: object) -> None:
        context.pop("value", None)
        super().__init__(message, **context)


class ProviderUnavailable(MemactorsError):
    """Raised when the memory provider times out, errors, or its breaker is open."""

    code = "UNAVAILABLE"
    mcp_code = "unavailable"


class ProviderTimeout(ProviderUnavailable):
    """Raised when a call to the memory provider does not answer within its deadline; names the
    provider, the operation (the contract tool) and the deadline, so a log line says all three."""

    def __init__(self, operation: str, deadline: float, **context: object) -> None:
        super().__init__(f"{operation} did not answer within {deadline:g}s", operation=operation,
                         deadline_s=f"{deadline:g}", **context)
        self.operation = operation
        self.deadline = deadline


class StoreUnavailable(MemactorsError):
    """Raised when the store's database cannot be reached or lost its connection (PostgreSQL down or
    unreachable); names the store as ``user@host:port/db``, never its password."""

    code = "UNAVAILABLE"
    mcp_code = "unavailable"


class ProviderIncompatible(ProviderUnavailable):
    """Raised when the provider lacks a contract tool or speaks an unsupported contract version."""

    code = "FAILED_PRECONDITION"


class ProviderReserved(MemactorsError):
    """Raised when anything but the daemon's memory code tries to reach the provider upstream (REQ-2)."""

    code = "PERMISSION_DENIED"
    mcp_code = "not_permitted"


class UnknownEpisode(MemactorsError):
    """Raised when an episode id names no episode in the daemon's store."""

    code = "NOT_FOUND"


class UnknownRun(MemactorsError):
    """Raised when a (harness, run id) names no run this daemon started (or it was forgotten since)."""

    code = "NOT_FOUND"


class NotAttributed(MemactorsError):
    """Raised when a caller presents no (or an unknown) run token and the surface needs one."""

    code = "UNAUTHENTICATED"
    mcp_code = "not_attributed"


class NoRepository(MemactorsError):
    """Raised when a run or harness has no repository key, so it has no episode scope."""

    code = "FAILED_PRECONDITION"
    mcp_code = "no_repository"


class PermissionDenied(MemactorsError):
    """Raised when a read-tier operator client calls a control-tier method."""

    code = "PERMISSION_DENIED"


class DeadlineExceeded(MemactorsError):
    """Raised when a request to an actor is not answered within the caller's deadline."""

    code = "DEADLINE_EXCEEDED"


class StoreDamaged(MemactorsError):
    """The store's file cannot be used: not a database, a damaged page, or not writable."""

    code = "FAILED_PRECONDITION"
    mcp_code = "unavailable"


class StoreFull(MemactorsError):
    """Raised when the store cannot write because its disk is full; names the path and the bytes free."""

    code = "RESOURCE_EXHAUSTED"
    mcp_code = "unavailable"


class ActorStopped(MemactorsError):
    """Raised to a requester whose request was pending, or sent, when the actor stopped."""

    code = "UNAVAILABLE"


def find_cause(exc: BaseException, match: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception in `exc` — itself, its cause or context, a group member, and theirs in turn —
    for which `match` is true; None when there is none.

    What went wrong is often a few links down (a driver's error under the one a layer raised, or inside a
    nursery's group): the supervisor looks for resource exhaustion and the store for a full disk this one
    way. Each exception is looked at once, since a context chain may loop back on itself.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if match(current):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def single_leaf(exc: BaseException) -> BaseException:
    """The one exception inside `exc`'s nested one-exception groups (a nursery's), else `exc` itself: how
    an API edge unwraps a group deliberately, raising a lone error as it is and a real group as a group."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


#: ``memactors run --wait`` exit statuses, by outcome (here, not in actors/runs.py, so the CLI reads
#: them without importing the runs actor, the spawn path and mcp: ~2 s of CPU per `memactors run`).
EXIT_STATUS = {"succeeded": 0, "failed": 1, "timed_out": 12, "cancelled": 13, "crashed": 14}


def exit_status(outcome: str | None) -> int:
    """The CLI's exit status for a run's outcome (docs/runs.md)."""
    return EXIT_STATUS.get(outcome or "", 1)
