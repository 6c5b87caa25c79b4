"""Wire formats at the edges: the one cattrs converter, run-record parsing and episode (de)serialisation.

Models carry no to_dict/from_row code; this module is the only place that knows how a model looks as
JSON, as an MCP payload or as a SQLite row.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import cattrs
import jsonschema

from ._fastcheck import compile_check
from .errors import InvalidArgument
from .models import Episode, RunRecord

converter = cattrs.Converter(omit_if_default=False)


@functools.cache
def _run_record_validator() -> jsonschema.Draft202012Validator:
    text = resources.files("memactors").joinpath("schemas/run_record.schema.json").read_text("utf-8")
    return jsonschema.Draft202012Validator(json.loads(text))


@functools.cache
def _fast_run_record_check() -> Callable[[Any], bool]:
    """The run record schema compiled (`_fastcheck`): a valid record is recognised in microseconds,
    where jsonschema's `iter_errors` walk cost ~2 ms of every ingest."""
    text = resources.files("memactors").joinpath("schemas/run_record.schema.json").read_text("utf-8")
    return compile_check(json.loads(text))


def _fast_valid(data: Any) -> bool:
    """True when the compiled check accepts `data`; a record it refuses, or cannot take, is walked by
    jsonschema, whose verdict and messages (naming the field) stand, as before."""
    return _fast_run_record_check()(data)


def _field_name(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return f"{path}.{missing}".lstrip(".")
    return path or "<record>"


# What each failed keyword means, in words that never repeat the value (it may be a secret or huge).
_REASONS = {
    "required": "is required",
    "type": "has the wrong type",
    "enum": "is not one of the allowed values",
    "minLength": "must not be empty",
    "maxLength": "is too long",
    "pattern": "has a character or form it may not have",
    "minimum": "is below its minimum",
    "maximum": "is above its maximum",
    "maxItems": "has too many items",
}

_TIME_FIELDS = ("started_at", "ended_at")
#: A repository key becomes a scope: at most 256 UTF-8 bytes (other one-line fields are bounded to 256
#: characters by the schema and cut to REQ-5's 256 bytes at assembly).
_LINE_BYTES = 256
# A repository key: host/owner/name (a remote URL is normalised to that first) or local/<absolute path>.
# Segments are non-empty, never "." or "..", and carry no backslash.
_BAD_SEGMENT = re.compile(r"(?:^|/)(?:\.\.?)?(?:/|$)|\\")


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 time; naive times are taken as UTC."""
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _reject(source: str, field: str, reason: str) -> InvalidArgument:
    return InvalidArgument(f"{source}: invalid field {field}: {reason}", field=field)


def _non_finite(value: Any, path: str = "") -> str | None:
    """The JSON path of the first non-finite number (Infinity, NaN) inside `value`, or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where or "<record>"
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}".lstrip(".")) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def check_repo_key(value: str, field: str = "repo", *, source: str = "record") -> str:
    """The repository key of an explicit ``repo`` value, or InvalidArgument naming `field`.

    A key is host/owner/name or ``local/<absolute path>``: at least two segments, none empty, "." or
    "..", no backslash, at most 256 UTF-8 bytes.
    """
    from .repo import explicit_key  # repo imports this module's errors only; kept local to stay acyclic

    key = explicit_key(value)
    if len(key.encode("utf-8", errors="surrogatepass")) > _LINE_BYTES:
        raise _reject(source, field, f"is longer than {_LINE_BYTES} bytes")
    if "/" not in key or _BAD_SEGMENT.search(key) or key.startswith("/"):
        raise _reject(source, field, "is not a repository key (host/owner/name or local/<absolute path>)")
    return key


def parse_run_record(data: Any, *, source: str = "record") -> RunRecord:
    """Validate a run record against schemas/run_record.schema.json (compiled once) and build the model.

    Raises InvalidArgument naming the first offending field as a JSON path (sorted, so the message is
    stable) and what is wrong with it, never the value.
    """
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source}: a run record must be a JSON object", field="<record>")
    bad = _non_finite(data)
    if bad is not None:
        raise _reject(source, bad, "must be a finite number")
    errors = [] if _fast_valid(data) else sorted(
        _run_record_validator().iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        first = errors[0]
        raise _reject(source, _field_name(first), _REASONS.get(str(first.validator), "is invalid"))
    for i, session in enumerate(data["sessions"]):
        if isinstance(session.get("repo"), str):
            try:
                check_repo_key(session["repo"], f"sessions[{i}].repo", source=source)
            except InvalidArgument as exc:
                if exc.context.get("field") != "repo":
                    raise
                raise _reject(source, f"sessions[{i}].repo", "must not be empty") from None
    times = [(k, data[k]) for k in _TIME_FIELDS]
    times += [(f"sessions[{i}].started_at", s["started_at"]) for i, s in enumerate(data["sessions"]) if "started_at" in s]
    times += [(f"events[{i}].at", e["at"]) for i, e in enumerate(data.get("events", []))]
    for field, value in times:
        try:
            parse_time(value).astimezone(UTC)  # (a time a date cannot hold in UTC, 0001-01-01T00:00+01:00, too)
        except (ValueError, OverflowError):
            raise _reject(source, field, "is not an RFC 3339 time") from None
    clean = {k: v for k, v in data.items() if v is not None}
    for key in ("sessions", "events"):
        if key in clean:
            clean[key] = [{k: v for k, v in item.items() if v is not None} for item in clean[key]]
    if "model" in clean:
        clean["model"] = {k: v for k, v in clean["model"].items() if v is not None}
    try:
        return converter.structure(clean, RunRecord)
    except cattrs.errors.BaseValidationError:  # schema and model disagree: a bug, reported as input error
        raise InvalidArgument(f"{source}: the record does not fit the run record model", field="<record>") from None


def dump_run_record(record: RunRecord) -> str:
    return json.dumps(converter.unstructure(record), sort_keys=True, separators=(",", ":"))


def load_run_record(text: str) -> RunRecord:
    return converter.structure(json.loads(text), RunRecord)


def episode_to_dict(episode: Episode) -> dict[str, Any]:
    """REQ-5's object as JSON: fields in REQ-5's order, tuples as lists."""
    unstructured: dict[str, Any] = converter.unstructure(episode)
    return unstructured


def episode_from_dict(data: dict[str, Any]) -> Episode:
    return converter.structure(data, Episode)


def episode_json(episode: Episode) -> str:
    return json.dumps(episode_to_dict(episode), ensure_ascii=False, separators=(",", ":"))
