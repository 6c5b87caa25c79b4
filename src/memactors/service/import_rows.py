"""What `store import` lets into a store: each export row checked as strictly as the store will read it,
its strings redacted by the ingest path's redactor, and its scope derived from its repository.

`store.portable` reads the file and writes the rows; it calls `check_row` on each row first (handed in,
as it is handed the retention actor's `tombstone`: the store knows nothing of episodes' rules). A row
this refuses raises `RowRefused` with the reason, and the import goes on with the next line.

* ``episode``: the body is parsed into the same Episode model the retention actor and `memory
  episodes` parse (valid JSON, REQ-5's object per the provider contract's schema, finite numbers, at
  most MAX_EPISODE_BODY_BYTES), its id the row's; then cleaned and bounded as `assemble` makes an
  episode (`episode.reclean_episode`). The row's columns are taken from that episode, never from the
  file, and the scope is ``project:<repo>`` of its repository key, whatever scope the file gives.
* ``run``: the stored record is parsed as `runs ingest` parses one (`prepare_record`: size bound,
  schema, redaction, prompt dropped); the row's columns come from it.
* ``run_path``, tombstones, ``fact``: each column's type and form; every string cleaned; a fact's
  confidence a finite number from 0 to 1, its scope ``fleet`` or ``project:<repository key>``.
* ``index``: checked here for form; `store.portable` takes its scope from the episode it names.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

import cattrs
import jsonschema
from jsonschema.exceptions import best_match

from .._fastcheck import compile_check
from .._limits import MAX_EPISODE_BODY_BYTES
from .._wire import _non_finite, check_repo_key, converter, episode_from_dict, episode_json, parse_time
from ..contract import load_schemas
from ..episode import clean, cut_utf8, one_line, reclean_episode, stored_record
from ..errors import InvalidArgument
from ..models import RunRecord
from ..repo import scope_for
from ..store import iso
from ..store.portable import RowRefused
from ..store.run_history import record_json
from .ingest import prepare_record

__all__ = ["check_row"]

_EPISODE_ID = re.compile(r"^ep_[0-9a-f]{20}$")
_FACT_ID = re.compile(r"^f_[0-9A-Za-z_]{1,64}$")
_OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out", "crashed")
_TRUST = ("standard", "untrusted_input")
_FACT_STATUSES = ("live", "suspect", "retired")
#: A stored path (run_paths.path) or fact text: bounded as the graph bounds what it keeps.
_PATH_BYTES = 4096
_FACT_BYTES = 4096
#: Episode fields the contract lets be null where the model keeps "" (an episode this daemon assembles
#: never has a null there) or 0.
_NULL_AS_EMPTY = ("trace_id", "model", "branch")
#: The largest number a stored episode or row carries (JSON's safe integers; a store column is 64-bit).
_MAX_NUMBER = 2**53


def _episode_schema() -> dict[str, Any]:
    episode: dict[str, Any] = load_schemas()["memory_record_episode.input"]["properties"]["episode"]
    return episode


@functools.cache
def _episode_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_episode_schema())


@functools.cache
def _episode_fast_check() -> Callable[[Any], bool]:
    """The schema compiled (`_fastcheck`): a valid episode is recognised in microseconds; one it refuses
    is walked by jsonschema, whose error names the field."""
    return compile_check(_episode_schema())


def _path(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [r for r in error.validator_value if r not in error.instance]
        path = f"{path}.{missing[0]}".lstrip(".") if missing else path
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = sorted(k for k in error.instance if k not in error.schema.get("properties", {}))
        path = f"{path}.{extra[0]}".lstrip(".") if extra else path
    return path or "<episode>"


def _string(row: dict[str, Any], col: str, *, limit: int = 256, empty: bool = False, line: bool = True) -> str:
    value = row.get(col)
    if not isinstance(value, str):
        raise RowRefused(f"{col} must be a string")
    if not empty and not value.strip():
        raise RowRefused(f"{col} must not be empty")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise RowRefused(f"{col} is longer than {limit} bytes")
    return one_line(clean(value)) if line else clean(value)


def _optional(row: dict[str, Any], col: str, *, limit: int = 256) -> str | None:
    return None if row.get(col) is None else _string(row, col, limit=limit, empty=True)


def _time(row: dict[str, Any], col: str, *, nullable: bool = False) -> str | None:
    value = row.get(col)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise RowRefused(f"{col} must be an RFC 3339 time")
    try:
        return iso(parse_time(value))
    except (ValueError, OverflowError):
        raise RowRefused(f"{col} is not an RFC 3339 time") from None


def _repo(value: Any, col: str = "repo") -> str:
    if not isinstance(value, str):
        raise RowRefused(f"{col} must be a repository key")
    try:
        return check_repo_key(one_line(clean(value)), col, source="row")
    except InvalidArgument as exc:
        raise RowRefused(f"{col} is not a repository key (host/owner/name or local/<absolute path>)") from exc


def _episode_id(row: dict[str, Any]) -> str:
    value = row.get("episode_id")
    if not isinstance(value, str) or not _EPISODE_ID.match(value):
        raise RowRefused("episode_id must be ep_ and 20 hex digits")
    return value


def _one_of(row: dict[str, Any], col: str, allowed: tuple[str, ...]) -> str:
    if row.get(col) not in allowed:
        raise RowRefused(f"{col} must be one of {', '.join(allowed)}")
    return str(row[col])


def _body(text: Any, episode_id: str) -> tuple[dict[str, Any], str]:
    """The row's episode body parsed, checked, cleaned and re-scoped: (its row columns, its JSON)."""
    if not isinstance(text, str):
        raise RowRefused("the episode's text must be its REQ-5 episode as a JSON string")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_EPISODE_BODY_BYTES:
        raise RowRefused(f"the episode is {size} bytes; the limit is {MAX_EPISODE_BODY_BYTES} bytes")
    try:
        data = json.loads(text)
    except RecursionError:
        raise RowRefused("the episode is nested too deeply") from None
    except ValueError:
        raise RowRefused("the episode's text is not JSON: it must be REQ-5's episode object") from None
    if not isinstance(data, dict):
        raise RowRefused("the episode's text is not a JSON object: it must be REQ-5's episode object")
    bad = _non_finite(data)
    if bad is not None:
        raise RowRefused(f"the episode's {bad} must be a finite number")
    for key in ("duration_ms", "cost_usd"):
        if isinstance(data.get(key), int | float) and not -_MAX_NUMBER <= data[key] <= _MAX_NUMBER:
            raise RowRefused(f"the episode's {key} is out of range")
    for n, failure in enumerate(data.get("verify_failures") or ()):
        count = failure.get("count") if isinstance(failure, dict) else None
        if isinstance(count, int) and count > _MAX_NUMBER:
            raise RowRefused(f"the episode's verify_failures[{n}].count is out of range")
    error = None if _episode_fast_check()(data) else best_match(_episode_validator().iter_errors(data))
    if error is not None:
        raise RowRefused(f"the episode's {_path(error)} is invalid ({error.validator})")
    if data["episode_id"] != episode_id:
        raise RowRefused("the episode's episode_id is not its row's")
    data = {**data, **{k: "" for k in _NULL_AS_EMPTY if data[k] is None}}
    if data["duration_ms"] is None:
        data["duration_ms"] = 0
    try:
        parse_time(data["started_at"])
    except ValueError:
        raise RowRefused("the episode's started_at is not an RFC 3339 time") from None
    try:
        episode = episode_from_dict(data)
    except (cattrs.BaseValidationError, ValueError, TypeError):
        raise RowRefused("the episode does not fit REQ-5's episode") from None
    episode = reclean_episode(episode, repo=_repo(episode.repo, "the episode's repo"))
    columns = {"harness": episode.harness, "run_id": episode.run_id, "repo": episode.repo,
               "branch": episode.branch, "scope": episode.scope, "trust_class": episode.trust_class,
               "outcome": episode.outcome, "started_at": episode.started_at}
    return columns, episode_json(episode)


def _check_episode(item: dict[str, Any]) -> dict[str, Any]:
    row = item["row"]
    episode_id = _episode_id(row)
    recorded_at = _time(row, "recorded_at")
    forgotten_at = _time(row, "forgotten_at", nullable=True)
    if forgotten_at is not None:  # a tombstone: its columns only, no body
        repo = _repo(row.get("repo"))
        return {"type": "episode", "text": None, "row": {
            "episode_id": episode_id, "harness": _string(row, "harness"), "run_id": _string(row, "run_id"),
            "repo": repo, "branch": _optional(row, "branch") or "", "scope": scope_for(repo),
            "trust_class": _one_of(row, "trust_class", _TRUST), "outcome": _one_of(row, "outcome", _OUTCOMES),
            "started_at": _string(row, "started_at"), "recorded_at": recorded_at, "forgotten_at": forgotten_at}}
    columns, body = _body(item.get("text"), episode_id)
    return {"type": "episode", "text": body, "row": {
        "episode_id": episode_id, **columns, "recorded_at": recorded_at, "forgotten_at": None}}


def _check_run(item: dict[str, Any]) -> dict[str, Any]:
    row = item["row"]
    repo = None if row.get("repo") is None else _repo(row.get("repo"))
    common = {"repo": repo, "branch": _optional(row, "branch"), "ingested_at": _time(row, "ingested_at")}
    text = item.get("text")
    if text is None:  # a run whose record was scrubbed with its forgotten episode
        duration = row.get("duration_ms")
        if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int) or duration < 0
                                     or duration > _MAX_NUMBER):
            raise RowRefused("duration_ms must be a whole number of milliseconds")
        return {"type": "run", "text": None, "row": {
            "harness": _string(row, "harness"), "run_id": _string(row, "run_id"), "adapter": _string(row, "adapter"),
            "started_at": _string(row, "started_at"), "ended_at": _string(row, "ended_at"),
            "outcome": _one_of(row, "outcome", _OUTCOMES), "reason": _string(row, "reason"),
            "duration_ms": duration, **common}}
    if not isinstance(text, str):
        raise RowRefused("the run's text must be its stored run record as a JSON string")
    try:
        data = json.loads(text)
    except RecursionError:
        raise RowRefused("the run record is nested too deeply") from None
    except ValueError:
        raise RowRefused("the run's text is not JSON: it must be its run record") from None
    try:
        record: RunRecord = stored_record(prepare_record(data, "the run record"))
    except InvalidArgument as exc:
        raise RowRefused(str(exc)) from None
    given = tuple(clean(v) if isinstance(v, str) else v for v in (row.get("harness"), row.get("run_id")))
    if (record.harness, record.run_id) != given:  # (compared as cleaned: an older store's row may hold more)
        raise RowRefused("the run record's harness and run_id are not its row's")
    raw = converter.unstructure(record)
    raw.pop("prompt", None)
    return {"type": "run", "text": record_json(raw), "row": {
        "harness": record.harness, "run_id": record.run_id, "adapter": record.adapter,
        "started_at": record.started_at, "ended_at": record.ended_at, "outcome": record.outcome,
        "reason": record.reason, "duration_ms": record.duration_ms, **common}}


def _check_run_path(item: dict[str, Any]) -> dict[str, Any]:
    row = item["row"]
    return {"type": "run_path", "row": {"harness": _string(row, "harness"), "run_id": _string(row, "run_id"),
                                        "repo": _repo(row.get("repo")), "path": _string(row, "path", limit=_PATH_BYTES)}}


def _check_index(item: dict[str, Any]) -> dict[str, Any]:
    row = item["row"]
    return {"type": "index", "row": {
        "provider": _string(row, "provider"), "provider_id": _string(row, "provider_id", limit=1024),
        "episode_id": _episode_id(row), "scope": None,  # the episode's own, taken by store.portable
        "recorded_at": _time(row, "recorded_at"), "forgotten_at": _time(row, "forgotten_at", nullable=True)}}


def _check_fact(item: dict[str, Any]) -> dict[str, Any]:
    row = item["row"]
    fact_id = row.get("id")
    if not isinstance(fact_id, str) or not _FACT_ID.match(fact_id):
        raise RowRefused("id must be f_ followed by up to 64 letters, digits or _")
    scope = row.get("scope")
    if scope != "fleet":
        if not isinstance(scope, str) or not scope.startswith("project:"):
            raise RowRefused("scope must be 'fleet' or 'project:<repository key>'")
        scope = scope_for(_repo(scope.removeprefix("project:"), "scope"))
    confidence = row.get("confidence")
    if (isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1
            or not math.isfinite(confidence)):
        raise RowRefused("confidence must be a number from 0 to 1")
    text = _string(row, "text", limit=_FACT_BYTES, line=False)
    return {"type": "fact", "row": {
        "id": fact_id, "scope": scope, "text": cut_utf8(text, _FACT_BYTES), "confidence": float(confidence),
        "status": _one_of(row, "status", _FACT_STATUSES), "created_at": _time(row, "created_at"),
        "updated_at": _time(row, "updated_at")}}


_CHECKS = {"episode": _check_episode, "run": _check_run, "run_path": _check_run_path, "index": _check_index,
           "fact": _check_fact}


def check_row(item: dict[str, Any]) -> dict[str, Any]:
    """The export line `item` ({"type", "row", "text"?}) as it may be stored, or RowRefused saying why."""
    check = _CHECKS.get(item["type"])
    if check is None:
        raise RowRefused(f"unknown type {str(item['type'])[:32]!r}")
    return check(item)
