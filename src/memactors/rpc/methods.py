"""The operator RPC's methods: each MemoryService handler under its RPC name, tier and parameters.

rpc/frames, tokens, server and client are the transport (its contract in rpc/__init__.py) and service/ the
handlers (service/read_tier.py, control_tier.py and daemon_runs.py); this is the edge between them, where a
frame's ``params`` become a handler's arguments. Every parameter is typed and bounded here (docs/contracts.md
"Input bounds"): a wrong type, a control character in an id or an oversized value is ``INVALID_ARGUMENT``
naming ``params.<field>``, never ``INTERNAL``, and the message never repeats the value. Every method
declares the parameters it reads, so one it does not take is refused by name before the handler runs
(docs/contracts.md "Input bounds").
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from .frames import Tier
from .server import Method

if TYPE_CHECKING:
    from ..service import MemoryService

SERVICE = "harness.v1.MemoryService"


def operator_methods(service: MemoryService) -> list[Method]:
    """Every MemoryService method the operator RPC serves (``serve_rpc``'s table), over `service`."""

    def m(name: str, tier: Tier, handler: Callable[[dict[str, Any]], Awaitable[Any]], *,
          params: tuple[str, ...] | None = None) -> Method:
        # `params`: every parameter the method reads; any other is refused by name before the handler
        # (Error Handling Standards; the gateway refuses an unknown tool argument the same way).
        return Method(f"{SERVICE}/{name}", tier, handler, params=None if params is None else frozenset(params))

    async def ingest(p: dict[str, Any]) -> Any:
        record = _param(p, "record", dict)
        return await service.ingest_run(record, source=_opt(p, "source", max_bytes=_ID_BYTES) or "record")

    return [
        m("Status", "read", lambda p: service.status(), params=()),
        m("Doctor", "read", lambda p: service.doctor(), params=()),
        m("Reindex", "control", lambda p: service.reindex(everything=_flag(p, "all")), params=("all",)),
        m("ListEpisodes", "read", lambda p: service.list_episodes(
            harness=_opt_id(p, "harness"), repo=_opt_id(p, "repo"), since=_opt_id(p, "since"),
            limit=_int(p, "limit", 100, 0, 10_000), after=_opt(p, "after", max_bytes=1024),
            outcome=_opt_id(p, "outcome"), paths=_paths(p, "paths"), run_id=_opt_id(p, "run_id")),
          params=("harness", "repo", "since", "limit", "after", "outcome", "paths", "run_id")),
        m("GetEpisode", "read", lambda p: service.get_episode(_id(p, "episode_id")), params=("episode_id",)),
        m("Recall", "read", lambda p: service.recall(
            query=_text(p, "query"), repo=_opt_id(p, "repo"), as_harness=_opt_id(p, "as"),
            paths=_paths(p, "paths"), limit=_int(p, "limit", 8, 0, 100)),
          params=("query", "repo", "as", "paths", "limit")),
        m("IngestRun", "control", ingest, params=("record", "source")),
        m("IngestRuns", "control", lambda p: service.ingest_runs(_records(p)), params=("records",)),
        m("Forget", "control", lambda p: service.forget(_id(p, "episode_id")), params=("episode_id",)),
        m("CheckProvider", "control", lambda p: service.check_provider(_opt_id(p, "provider")),
          params=("provider",)),
        m("GetBriefing", "read", lambda p: service.get_briefing(_id(p, "harness")), params=("harness",)),
        m("DescribeHarness", "read", lambda p: service.describe_harness(_id(p, "harness")),
          params=("harness",)),
        m("AddFact", "control", lambda p: service.add_fact(
            scope=_id(p, "scope"), text=_text(p, "text"), confidence=_number(p, "confidence"),
            status=_opt_id(p, "status") or "live", fact_id=_opt_id(p, "id")),
          params=("scope", "text", "confidence", "status", "id")),
        m("LinkPullRequest", "control", lambda p: service.link_pull_request(
            repo=_id(p, "repo"), branch=_id(p, "branch"), url=_id(p, "url", max_bytes=_URL_BYTES)),
          params=("repo", "branch", "url")),
        m("ReportPresence", "control", lambda p: service.report_presence(
            harness=_id(p, "harness"), run_id=_id(p, "run_id"),
            session_id=_id(p, "session_id"), repo=_id(p, "repo"), branch=_opt_id(p, "branch"),
            paths=_paths(p, "paths"), ttl_seconds=_int(p, "ttl_seconds", 300, 1, 86_400)),
          params=("harness", "run_id", "session_id", "repo", "branch", "paths", "ttl_seconds")),
        m("CastVote", "control", lambda p: service.cast_vote(
            fact_id=_id(p, "fact_id"), run_id=_id(p, "run_id"),
            harness=_id(p, "harness"), stance=_id(p, "stance")),
          params=("fact_id", "run_id", "harness", "stance")),
        m("StartRun", "control", lambda p: service.start_run(
            harness=_id(p, "harness"), prompt=_opt(p, "prompt", max_bytes=_PROMPT_BYTES, single_line=False),
            run_id=_opt_id(p, "run_id")), params=("harness", "prompt", "run_id")),
        m("WaitRun", "read", lambda p: service.wait_run(
            harness=_opt_id(p, "harness"), run_id=_id(p, "run_id"),
            wait_seconds=_opt_number(p, "wait_seconds", 30.0)),
          params=("harness", "run_id", "wait_seconds")),
        m("GetRun", "read", lambda p: service.get_run(run_id=_id(p, "run_id"), harness=_opt_id(p, "harness")),
          params=("run_id", "harness")),
        m("ListRuns", "read", lambda p: service.list_runs(
            harness=_opt_id(p, "harness"), state=_opt_id(p, "state"), limit=_int(p, "limit", 50, 1, 1000),
            after=_opt(p, "after", max_bytes=1024)),
          params=("harness", "state", "limit", "after")),
        m("CancelRun", "control", lambda p: service.cancel_run(
            run_id=_id(p, "run_id"), harness=_opt_id(p, "harness")),
          params=("run_id", "harness")),
        m("RunLogs", "read", lambda p: service.run_logs(
            run_id=_id(p, "run_id"), harness=_opt_id(p, "harness"), after=_int(p, "after", 0, 0, 2**62),
            wait_seconds=_opt_number(p, "wait_seconds", 0.0)),
          params=("run_id", "harness", "after", "wait_seconds")),
        m("MintRunToken", "control", lambda p: service.mint_run_token(
            harness=_id(p, "harness"), run_id=_id(p, "run_id"),
            workdir=_opt(p, "workdir", max_bytes=_PATH_BYTES, single_line=True) or "",
            ttl_seconds=_opt_number(p, "ttl_seconds", None), replace=_flag(p, "replace")),
          params=("harness", "run_id", "workdir", "ttl_seconds", "replace")),
        m("RevokeRunTokens", "control", lambda p: service.revoke_run_tokens(
            harness=_id(p, "harness"), run_id=_id(p, "run_id")),
          params=("harness", "run_id")),
    ]


def _param(params: dict[str, Any], name: str, kind: type) -> Any:
    value = params.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InvalidArgument(f"params.{name} must be a {_KIND_NAMES.get(kind, kind.__name__)}", field=f"params.{name}")
    return value


_KIND_NAMES = {str: "string", dict: "JSON object", list: "list", int: "integer"}
#: Bounds of RPC parameters (UTF-8 bytes): ids and keys as REQ-5's fields, URLs, paths, free text.
_ID_BYTES = 256
_URL_BYTES = 2048
_PATH_BYTES = 4096
_TEXT_BYTES = 16_384
_PROMPT_BYTES = 1024 * 1024  # an operator prompt for StartRun (the composed one never travels)
_MAX_PATHS = 100
# C0/C1 controls, DEL and the line separators: never inside an id, a key or a path.
_LINE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_TEXT_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _check_str(value: str, field: str, *, max_bytes: int, single_line: bool) -> str:
    if len(value) > max_bytes or len(value.encode("utf-8", errors="surrogatepass")) > max_bytes:
        raise InvalidArgument(f"{field} is longer than {max_bytes} bytes", field=field)
    if (_LINE_CONTROL if single_line else _TEXT_CONTROL).search(value):
        raise InvalidArgument(f"{field} must not contain control characters", field=field)
    if any("\ud800" <= c <= "\udfff" for c in value):
        raise InvalidArgument(f"{field} must be valid UTF-8 text", field=field)
    return value


def _opt(params: dict[str, Any], name: str, *, max_bytes: int = _ID_BYTES, single_line: bool = True) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"params.{name} must be a string", field=f"params.{name}")
    return _check_str(value, f"params.{name}", max_bytes=max_bytes, single_line=single_line)


def _opt_id(params: dict[str, Any], name: str) -> str | None:
    return _opt(params, name)


def _id(params: dict[str, Any], name: str, *, max_bytes: int = _ID_BYTES) -> str:
    value = _opt(params, name, max_bytes=max_bytes)
    if value is None:
        raise InvalidArgument(f"params.{name} must be a string", field=f"params.{name}")
    return value


def _text(params: dict[str, Any], name: str) -> str:
    value = _opt(params, name, max_bytes=_TEXT_BYTES, single_line=False)
    if value is None:
        raise InvalidArgument(f"params.{name} must be a string", field=f"params.{name}")
    return value


def _int(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"params.{name} must be an integer from {low} to {high}", field=f"params.{name}")
    return value


def _opt_number(params: dict[str, Any], name: str, default: float | None) -> Any:
    """An optional finite number (``default`` when absent or null)."""
    return default if params.get(name) is None else _number(params, name)


def _flag(params: dict[str, Any], name: str) -> bool:
    """An optional boolean, false when absent or null."""
    value = params.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"params.{name} must be true or false", field=f"params.{name}")
    return value


def _records(params: dict[str, Any]) -> list[Any]:
    value = params.get("records")
    if not isinstance(value, list):
        raise InvalidArgument("params.records must be a list of {record, source} objects", field="params.records")
    return value


def _number(params: dict[str, Any], name: str) -> float:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"params.{name} must be a finite number", field=f"params.{name}")
    try:
        number = float(value)  # an integer past a float's range (10**400) overflows: not a finite number
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InvalidArgument(f"params.{name} must be a finite number", field=f"params.{name}")
    return number


def _paths(params: dict[str, Any], name: str) -> tuple[str, ...]:
    value = params.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_PATHS:
        raise InvalidArgument(f"params.{name} must be a list of at most {_MAX_PATHS} strings", field=f"params.{name}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidArgument(f"params.{name}[{i}] must be a string", field=f"params.{name}[{i}]")
        out.append(_check_str(item, f"params.{name}[{i}]", max_bytes=_PATH_BYTES, single_line=True))
    return tuple(out)
