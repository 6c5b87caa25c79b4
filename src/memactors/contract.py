"""SPEC-0030 REQ-3: the provider contract, its shipped JSON Schemas, and the checks around every call.

A memory provider is an MCP server with four tools. This module is the one place that knows their
shapes: it loads the schemas shipped as package data (`memactors/schemas/contract/`), checks a request
against REQ-3's bounds before it is sent, turns an MCP `CallToolResult` into a JSON object, validates
that object as a whole, and splits a recall answer into the items Harness may use and the count of
invalid ones (REQ-9 drops those with reason ``invalid``; they are never truncated into shape).

Provider text never reaches a log through this module: error messages carry at most a redacted,
shortened excerpt (`ProviderError.excerpt`), and schema failures name only the failing field and the
schema rule, never the offending value.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any

import attrs
import jsonschema
import mcp.types as mcp_types
from jsonschema.exceptions import best_match

from ._fastcheck import compile_check
from .errors import InvalidArgument, ProviderIncompatible, ProviderUnavailable
from .redact import redact

#: Contract versions this binary speaks (REQ-3: ``memory_contract`` answers ``{contract: 1, ...}``).
SUPPORTED_CONTRACTS: frozenset[int] = frozenset({1})

#: The four tools a provider must expose, in the order REQ-3 lists them.
TOOLS: tuple[str, ...] = ("memory_contract", "memory_record_episode", "memory_recall", "memory_forget")

#: The built-in provider's in-process extension (not a contract tool, not listed by tools/list): many
#: ``memory_record_episode`` calls in one, ``{"episodes": [arguments, ...]}`` answering
#: ``{"results": [result, ...]}`` in order, all written in one store transaction. Each episode's
#: arguments and each result are checked against memory_record_episode's own schemas.
RECORD_MANY = "memory_record_episodes"

#: REQ-3's request bounds.
MAX_QUERY_CHARS = 512
MAX_SCOPES = 2
MIN_LIMIT, MAX_LIMIT = 1, 20
MAX_PATHS = 20

#: REQ-3's per-item bounds; an item breaking one is invalid and dropped, never truncated.
MAX_ITEM_TEXT_CHARS = 2000
MAX_ITEM_ID_CHARS = 128

#: Longest provider-text excerpt an error message may carry.
MAX_EXCERPT_CHARS = 200

_SCHEMA_PACKAGE_DIR = "schemas/contract"


class ProviderError(ProviderUnavailable):
    """Raised when a provider answers a call with an error or with a response Harness cannot use.

    ``excerpt`` is a redacted excerpt of at most 200 characters of what the provider said, for an
    operator's eyes (``memactors memory provider check``); it is deliberately not part of log context.
    """

    def __init__(self, message: str = "", *, excerpt: str = "", **context: object) -> None:
        super().__init__(message, **context)
        self.excerpt = excerpt


class ProviderSchemaError(ProviderError):
    """Raised when a provider response is malformed or fails its shipped JSON Schema as a whole."""


@attrs.frozen
class ProviderInfo:
    """What ``memory_contract`` answered: the contract version and the provider's name and version."""

    contract: int
    name: str
    version: str


@attrs.frozen
class RecallItem:
    """One valid ``memory_recall`` item. Only ``text`` and ``score`` are the provider's to say (REQ-9)."""

    id: str
    text: str
    score: float | None = None


# --- schemas -----------------------------------------------------------------------------------


@functools.cache
def _load() -> Mapping[str, dict[str, Any]]:
    root = resources.files("memactors").joinpath(_SCHEMA_PACKAGE_DIR)
    schemas: dict[str, dict[str, Any]] = {}
    for tool in TOOLS:
        for direction in ("input", "output"):
            name = f"{tool}.{direction}"
            schemas[name] = json.loads(root.joinpath(f"{name}.json").read_text("utf-8"))
    return MappingProxyType(schemas)


def load_schemas() -> Mapping[str, dict[str, Any]]:
    """The contract's schemas keyed ``"<tool>.input"`` / ``"<tool>.output"``, loaded once from package data.

    The mapping is read-only; treat the schema dicts inside as read-only too (they are shared).
    """
    return _load()


def schema_document() -> dict[str, Any]:
    """Every contract schema in one JSON-able document, as ``memactors memory provider schema`` prints it."""
    schemas = load_schemas()
    return {
        "contracts": sorted(SUPPORTED_CONTRACTS),
        "tools": {
            tool: {"input": schemas[f"{tool}.input"], "output": schemas[f"{tool}.output"]} for tool in TOOLS
        },
    }


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_schemas()[name])


def _field_path(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = [
            r for r in error.validator_value if isinstance(error.instance, dict) and r not in error.instance
        ]
        if missing:
            return f"{path}.{missing[0]}".lstrip(".")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            return f"{path}.{extra[0]}".lstrip(".")
    return path or "<root>"


def _first_error(
    validator: jsonschema.Draft202012Validator, instance: Any
) -> jsonschema.ValidationError | None:
    return best_match(validator.iter_errors(instance))


@functools.cache
def _fast_check(name: str) -> Callable[[Any], bool]:
    """A compiled validity test for schema ``name`` (`_fastcheck`): about a microsecond where
    jsonschema's ``iter_errors`` walk costs 50-300 µs on every valid request and response."""
    return compile_check(load_schemas()[name])


def _schema_error(name: str, instance: Any) -> jsonschema.ValidationError | None:
    """jsonschema's best error for ``instance`` against schema ``name``, None when it is valid.

    Valid instances (nearly all) are recognised by the compiled check and never walked by jsonschema;
    anything it does not accept goes the reference way, so the verdict and the message naming the
    field are jsonschema's, as before.
    """
    if _fast_check(name)(instance):
        return None
    return _first_error(_validator(name), instance)


# --- redaction of provider text in error messages ------------------------------------------------


def scrub_excerpt(text: str) -> str:
    """A provider's text made fit for an error message: redacted by the shared redactor, ≤200 chars.

    Only a bounded prefix (4000 characters after whitespace is collapsed) is redacted, so a secret cut
    at that bound lies far past the 200 characters kept.
    """
    prefix = " ".join(text.split())[: 20 * MAX_EXCERPT_CHARS]
    cleaned = " ".join(redact(prefix).split())
    if len(cleaned) > MAX_EXCERPT_CHARS:
        cleaned = cleaned[: MAX_EXCERPT_CHARS - 1] + "…"
    return cleaned


# --- responses -----------------------------------------------------------------------------------


def _texts(result: mcp_types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]


def tool_result_payload(result: mcp_types.CallToolResult, *, provider: str, tool: str) -> dict[str, Any]:
    """The JSON object a provider answered with: its structured content, else its single text block parsed.

    Raises `ProviderError` when the provider reported an error (``is_error``), and
    `ProviderSchemaError` when the answer is not exactly one JSON object (no or several content blocks,
    non-text content, text that is not JSON, JSON that is not an object).
    """
    if result.is_error:
        excerpt = scrub_excerpt(" ".join(_texts(result)))
        raise ProviderError(
            f"provider answered {tool} with an error: {excerpt}"
            if excerpt
            else f"provider answered {tool} with an error",
            excerpt=excerpt,
            provider=provider,
            tool=tool,
        )
    if result.structured_content is not None:
        if not isinstance(result.structured_content, dict):
            raise ProviderSchemaError(
                f"{tool} structured content is not a JSON object", provider=provider, tool=tool
            )
        return dict(result.structured_content)
    if len(result.content) != 1:
        raise ProviderSchemaError(
            f"{tool} answered with {len(result.content)} content blocks and no structured content, expected one",
            provider=provider,
            tool=tool,
        )
    block = result.content[0]
    if not isinstance(block, mcp_types.TextContent):
        raise ProviderSchemaError(
            f"{tool} answered with a {block.type} block, expected JSON text", provider=provider, tool=tool
        )
    try:
        payload = json.loads(block.text)
    except ValueError:
        excerpt = scrub_excerpt(block.text)
        raise ProviderSchemaError(
            f"{tool} answered with text that is not JSON: {excerpt}",
            excerpt=excerpt,
            provider=provider,
            tool=tool,
        ) from None
    if not isinstance(payload, dict):
        raise ProviderSchemaError(
            f"{tool} answered with JSON {type(payload).__name__}, expected an object",
            provider=provider,
            tool=tool,
        )
    return payload


def validate_response(tool: str, payload: dict[str, Any], *, provider: str) -> dict[str, Any]:
    """Return ``payload`` when it satisfies ``tool``'s output schema; else raise `ProviderSchemaError`.

    The message names the failing field and schema rule only, never the provider's value. Per-item
    bounds of ``memory_recall`` are not checked here (see `split_items`).
    """
    if tool == RECORD_MANY:
        results = payload.get("results")
        if not isinstance(results, list):
            raise ProviderSchemaError(f"{tool} response has no results list", provider=provider, tool=tool)
        for result in results:
            if not isinstance(result, dict):
                raise ProviderSchemaError(f"{tool} response holds a result that is not an object",
                                          provider=provider, tool=tool)
            validate_response("memory_record_episode", result, provider=provider)
        return payload
    if tool not in TOOLS:
        raise InvalidArgument(f"unknown contract tool {tool!r}", tool=tool)
    error = _schema_error(f"{tool}.output", payload)
    if error is not None:
        raise ProviderSchemaError(
            f"{tool} response fails its schema at {_field_path(error)} ({error.validator})",
            provider=provider,
            tool=tool,
        )
    return payload


def split_items(payload: Mapping[str, Any]) -> tuple[list[RecallItem], int]:
    """Split a ``memory_recall`` answer into its valid items and the number of invalid ones.

    An item is invalid (and dropped whole, never truncated) when it is not an object, its id is not a
    non-empty string of at most 128 characters, its text is not a string of at most 2000 characters,
    or its score is present but not a finite number. Python's json accepts ``NaN`` and ``Infinity``,
    so non-finite scores do arrive here; a ``null`` score counts as non-finite too, because encoders
    such as pydantic's and JavaScript's write NaN as ``null``.
    """
    items = payload.get("items")
    if not isinstance(items, list):
        raise ProviderSchemaError("memory_recall response has no items list", tool="memory_recall")
    kept: list[RecallItem] = []
    invalid = 0
    for item in items:
        parsed = _parse_item(item)
        if parsed is None:
            invalid += 1
        else:
            kept.append(parsed)
    return kept, invalid


def _parse_item(item: object) -> RecallItem | None:
    if not isinstance(item, Mapping):
        return None
    item_id, text, score = item.get("id"), item.get("text"), item.get("score")
    if not isinstance(item_id, str) or not 0 < len(item_id) <= MAX_ITEM_ID_CHARS:
        return None
    if not isinstance(text, str) or len(text) > MAX_ITEM_TEXT_CHARS:
        return None
    if "score" not in item:
        return RecallItem(id=item_id, text=text, score=None)
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None
    try:
        value = float(score)
    except OverflowError:  # an int too large for a float is not a usable score
        return None
    if not math.isfinite(value):
        return None
    return RecallItem(id=item_id, text=text, score=value)


def contract_info(payload: dict[str, Any], *, provider: str | None = None) -> ProviderInfo:
    """What a ``memory_contract`` answer announces, whatever the version (`ProviderSchemaError` when the
    payload is malformed): kept even for a provider then found incompatible, so status can say which
    contract it spoke."""
    validate_response("memory_contract", payload, provider=provider or "?")
    return ProviderInfo(
        contract=payload["contract"],
        name=payload["provider"]["name"],
        version=payload["provider"]["version"],
    )


def check_contract(payload: dict[str, Any], *, provider: str | None = None) -> ProviderInfo:
    """Read a ``memory_contract`` answer; raise `ProviderIncompatible` when its version is unsupported.

    The payload is validated first (`ProviderSchemaError` when malformed).
    """
    return check_supported(contract_info(payload, provider=provider), provider=provider)


def check_supported(info: ProviderInfo, *, provider: str | None = None) -> ProviderInfo:
    """``info`` when this binary speaks its contract version; else raise `ProviderIncompatible`."""
    if info.contract not in SUPPORTED_CONTRACTS:
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_CONTRACTS))
        raise ProviderIncompatible(
            f"provider speaks contract {info.contract}; this binary supports {supported}",
            provider=provider,
            contract=info.contract,
        )
    return info


def missing_tools(tool_names: Iterable[str]) -> list[str]:
    """The contract tools absent from ``tool_names``, in REQ-3's order (empty when all four are there)."""
    present = set(tool_names)
    return [tool for tool in TOOLS if tool not in present]


# --- requests ------------------------------------------------------------------------------------


def _check_path(index: int, path: object) -> None:
    field = f"paths[{index}]"
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{field} must be a non-empty repository-relative path", field=field)
    if path.startswith("/"):
        raise InvalidArgument(f"{field} must be repository-relative, not absolute", field=field)
    if ".." in path.replace("\\", "/").split("/"):
        raise InvalidArgument(f"{field} must not contain a '..' segment", field=field)


def _check_recall(arguments: Mapping[str, Any]) -> None:
    query = arguments.get("query")
    if isinstance(query, str) and len(query) > MAX_QUERY_CHARS:
        raise InvalidArgument(f"query exceeds {MAX_QUERY_CHARS} characters", field="query", chars=len(query))
    scope = arguments.get("scope")
    if isinstance(scope, list) and not 1 <= len(scope) <= MAX_SCOPES:
        raise InvalidArgument("scope must hold one or two scope strings", field="scope", count=len(scope))
    limit = arguments.get("limit")
    if isinstance(limit, int) and not isinstance(limit, bool) and not MIN_LIMIT <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be {MIN_LIMIT} to {MAX_LIMIT}", field="limit", limit=limit)
    paths = arguments.get("paths")
    if isinstance(paths, list):
        if len(paths) > MAX_PATHS:
            raise InvalidArgument(
                f"paths holds more than {MAX_PATHS} entries", field="paths", count=len(paths)
            )
        for index, path in enumerate(paths):
            _check_path(index, path)


def check_request(tool: str, arguments: Mapping[str, Any]) -> None:
    """Raise `InvalidArgument` naming the field when ``arguments`` break REQ-3's bounds or ``tool``'s input schema.

    Called before every request leaves the daemon, so a provider never sees an out-of-contract call.
    """
    if tool == RECORD_MANY:
        episodes = arguments.get("episodes")
        if not isinstance(episodes, list):
            raise InvalidArgument(f"{tool} request has no episodes list", field="episodes", tool=tool)
        for episode in episodes:
            check_request("memory_record_episode", episode)
        return
    if tool not in TOOLS:
        raise InvalidArgument(f"unknown contract tool {tool!r}", field="tool")
    if tool == "memory_recall":
        _check_recall(arguments)
    error = _schema_error(f"{tool}.input", dict(arguments))
    if error is not None:
        field = _field_path(error)
        raise InvalidArgument(
            f"{tool} request is invalid at {field} ({error.validator})", field=field, tool=tool
        )
