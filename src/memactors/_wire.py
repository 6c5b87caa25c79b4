"""Wire formats at the edges: the one cattrs converter, run-record parsing and episode (de)serialisation.

Models carry no to_dict/from_row code; this module is the only place that knows how a model looks as
JSON, as an MCP payload or as a SQLite row.
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import cattrs
import jsonschema

from .errors import InvalidArgument
from .models import Episode, RunRecord

converter = cattrs.Converter(omit_if_default=False)


@functools.cache
def _run_record_validator() -> jsonschema.Draft202012Validator:
    text = resources.files("memactors").joinpath("schemas/run_record.schema.json").read_text("utf-8")
    return jsonschema.Draft202012Validator(json.loads(text))


def _field_name(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return f"{path}.{missing}".lstrip(".")
    return path or "<record>"


_TIME_FIELDS = ("started_at", "ended_at")


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 time; naive times are taken as UTC."""
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_run_record(data: Any, *, source: str = "record") -> RunRecord:
    """Validate a run record against schemas/run_record.schema.json and build the model.

    Raises InvalidArgument naming the first offending field (sorted, so the message is stable).
    """
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source}: a run record must be a JSON object", field="<record>")
    errors = sorted(_run_record_validator().iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        first = errors[0]
        field = _field_name(first)
        raise InvalidArgument(f"{source}: invalid field {field}: {first.message[:200]}", field=field)
    times = [(k, data[k]) for k in _TIME_FIELDS]
    times += [(f"sessions[{i}].started_at", s["started_at"]) for i, s in enumerate(data["sessions"]) if "started_at" in s]
    times += [(f"events[{i}].at", e["at"]) for i, e in enumerate(data.get("events", []))]
    for field, value in times:
        try:
            parse_time(value)
        except ValueError:
            raise InvalidArgument(f"{source}: invalid field {field}: {value!r} is not an RFC 3339 time", field=field) from None
    clean = {k: v for k, v in data.items() if v is not None}
    for key in ("sessions", "events"):
        if key in clean:
            clean[key] = [{k: v for k, v in item.items() if v is not None} for item in clean[key]]
    if "model" in clean:
        clean["model"] = {k: v for k, v in clean["model"].items() if v is not None}
    try:
        return converter.structure(clean, RunRecord)
    except cattrs.errors.BaseValidationError as exc:  # schema and model disagree: a bug, reported as input error
        raise InvalidArgument(f"{source}: {cattrs.transform_error(exc)[0]}", field="<record>") from None


def dump_run_record(record: RunRecord) -> str:
    return json.dumps(converter.unstructure(record), sort_keys=True, separators=(",", ":"))


def load_run_record(text: str) -> RunRecord:
    return converter.structure(json.loads(text), RunRecord)


def episode_to_dict(episode: Episode) -> dict[str, Any]:
    """REQ-5's object as JSON: fields in REQ-5's order, tuples as lists."""
    return converter.unstructure(episode)


def episode_from_dict(data: dict[str, Any]) -> Episode:
    return converter.structure(data, Episode)


def episode_json(episode: Episode) -> str:
    return json.dumps(episode_to_dict(episode), ensure_ascii=False, separators=(",", ":"))
