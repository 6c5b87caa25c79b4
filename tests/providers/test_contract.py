"""SPEC-0030 REQ-3: the provider contract's schemas, response handling and request bounds."""

from __future__ import annotations

import json
import math

import jsonschema
import mcp.types as t
import pytest

from memactors.conformance import synthetic_episode
from memactors.contract import (
    SUPPORTED_CONTRACTS,
    TOOLS,
    ProviderError,
    ProviderInfo,
    ProviderSchemaError,
    RecallItem,
    check_contract,
    check_request,
    load_schemas,
    missing_tools,
    schema_document,
    scrub_excerpt,
    split_items,
    tool_result_payload,
    validate_response,
)
from memactors.errors import InvalidArgument, ProviderIncompatible, ProviderUnavailable

pytestmark = pytest.mark.req3


def _text(text: str) -> t.TextContent:
    return t.TextContent(type="text", text=text)


# --- schemas ---------------------------------------------------------------------------------------


def test_every_tool_has_a_valid_input_and_output_schema() -> None:
    schemas = load_schemas()
    assert set(schemas) == {f"{tool}.{d}" for tool in TOOLS for d in ("input", "output")}
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_document_holds_all_four_tools_for_the_schema_command() -> None:
    doc = schema_document()
    assert doc["contracts"] == sorted(SUPPORTED_CONTRACTS)
    assert list(doc["tools"]) == list(TOOLS)
    assert doc["tools"]["memory_recall"]["input"]["properties"]["limit"]["maximum"] == 20
    json.dumps(doc)  # printable as JSON


# --- payload extraction --------------------------------------------------------------------------


def test_structured_content_is_the_payload() -> None:
    result = t.CallToolResult(content=[_text("ignored")], structured_content={"forgotten": True})
    assert tool_result_payload(result, provider="p", tool="memory_forget") == {"forgotten": True}


def test_a_single_json_text_block_is_the_payload() -> None:
    result = t.CallToolResult(content=[_text('{"ids": ["a"]}')])
    assert tool_result_payload(result, provider="p", tool="memory_record_episode") == {"ids": ["a"]}


def test_two_text_blocks_without_structured_content_are_a_provider_error() -> None:
    result = t.CallToolResult(content=[_text('{"ids": ["a"]}'), _text('{"ids": ["b"]}')])
    with pytest.raises(ProviderSchemaError, match="2 content blocks") as info:
        tool_result_payload(result, provider="p", tool="memory_record_episode")
    assert info.value.context == {"provider": "p", "tool": "memory_record_episode"}


def test_no_content_is_a_provider_error() -> None:
    with pytest.raises(ProviderSchemaError):
        tool_result_payload(t.CallToolResult(content=[]), provider="p", tool="memory_forget")


def test_text_that_is_not_json_is_a_provider_error() -> None:
    with pytest.raises(ProviderSchemaError, match="not JSON"):
        tool_result_payload(
            t.CallToolResult(content=[_text("all good!")]), provider="p", tool="memory_forget"
        )


def test_json_that_is_not_an_object_is_a_provider_error() -> None:
    with pytest.raises(ProviderSchemaError, match="expected an object"):
        tool_result_payload(t.CallToolResult(content=[_text("[1, 2]")]), provider="p", tool="memory_forget")


@pytest.mark.errors
def test_is_error_is_a_provider_unavailable_error_with_a_redacted_short_excerpt() -> None:
    secret = "ghp_" + "A1b2" * 9
    text = f"upstream exploded with token {secret} " + "and then some " * 50
    result = t.CallToolResult(content=[_text(text)], is_error=True)
    with pytest.raises(ProviderUnavailable) as info:
        tool_result_payload(result, provider="zep", tool="memory_recall")
    err = info.value
    assert isinstance(err, ProviderError)
    assert err.context == {"provider": "zep", "tool": "memory_recall"}
    assert secret not in str(err) and "[REDACTED]" in err.excerpt
    assert len(err.excerpt) <= 200


def test_scrub_excerpt_strips_control_characters_and_caps_length() -> None:
    out = scrub_excerpt("a\x1b[31mb\x00c\n" + "x" * 500)
    assert "\x1b" not in out and "\x00" not in out and len(out) == 200


# --- whole-response validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "payload"),
    [
        ("memory_contract", {"contract": 1, "provider": {"name": "zep", "version": "0.9"}, "extra": True}),
        ("memory_record_episode", {"ids": ["a", "b"]}),
        ("memory_recall", {"items": [{"id": "a", "text": "t"}, {"id": "b", "text": "u", "score": 0.3}]}),
        ("memory_recall", {"items": [], "degraded": "embeddings_unavailable"}),
        ("memory_forget", {"forgotten": False}),
    ],
)
def test_good_responses_validate(tool: str, payload: dict) -> None:
    assert validate_response(tool, payload, provider="p") is payload


@pytest.mark.parametrize(
    ("tool", "payload", "field"),
    [
        ("memory_contract", {"contract": "1", "provider": {"name": "z", "version": "1"}}, "contract"),
        ("memory_contract", {"contract": 1}, "provider"),
        ("memory_record_episode", {"ids": []}, "ids"),
        ("memory_record_episode", {"ids": [str(i) for i in range(33)]}, "ids"),
        ("memory_recall", {"things": 1}, "items"),
        ("memory_recall", {"items": [{"id": 5, "text": "t"}]}, "items[0].id"),
        ("memory_forget", {"forgotten": "yes"}, "forgotten"),
    ],
)
def test_bad_responses_are_provider_errors_naming_the_field_not_the_value(
    tool: str, payload: dict, field: str
) -> None:
    with pytest.raises(ProviderSchemaError) as info:
        validate_response(tool, payload, provider="p")
    assert f" at {field} " in info.value.message
    assert "yes" not in info.value.message


def test_per_item_bounds_do_not_fail_the_whole_response() -> None:
    payload = {"items": [{"id": "x" * 500, "text": "y" * 5000, "score": float("inf")}]}
    validate_response("memory_recall", payload, provider="p")


# --- items -----------------------------------------------------------------------------------------


def test_req3_an_oversized_item_is_dropped_not_truncated() -> None:
    payload = {
        "items": [
            {"id": "ep_1", "text": "first", "score": 0.9},
            {"id": "ep_2", "text": "z" * 5000, "score": 0.8},
            {"id": "ep_3", "text": "third"},
        ]
    }
    kept, invalid = split_items(validate_response("memory_recall", payload, provider="p"))
    assert kept == [RecallItem("ep_1", "first", 0.9), RecallItem("ep_3", "third", None)]
    assert invalid == 1


def test_text_of_exactly_2000_characters_is_kept() -> None:
    kept, invalid = split_items({"items": [{"id": "a", "text": "z" * 2000}]})
    assert len(kept) == 1 and invalid == 0


@pytest.mark.req9
@pytest.mark.parametrize(
    "item",
    [
        {"id": "i" * 129, "text": "t"},
        {"id": "", "text": "t"},
        {"id": "a", "text": "t", "score": float("nan")},
        {"id": "a", "text": "t", "score": float("inf")},
        {"id": "a", "text": "t", "score": float("-inf")},
        {"id": "a", "text": "t", "score": None},
        {"id": "a", "text": "t", "score": True},
        {"id": "a", "text": "t", "score": "0.5"},
        {"id": 7, "text": "t"},
        {"id": "a", "text": ["t"]},
        {"id": "a"},
        "not an object",
    ],
)
def test_invalid_items_are_dropped_and_counted(item: object) -> None:
    kept, invalid = split_items({"items": [item, {"id": "ok", "text": "fine", "score": 2}]})
    assert kept == [RecallItem("ok", "fine", 2.0)]
    assert invalid == 1


def test_non_finite_scores_parsed_by_pythons_json_are_dropped() -> None:
    result = t.CallToolResult(
        content=[
            _text(
                '{"items": [{"id": "a", "text": "t", "score": NaN}, {"id": "b", "text": "u", "score": Infinity}, {"id": "c", "text": "v", "score": 1e400}]}'
            )
        ]
    )
    payload = validate_response(
        "memory_recall", tool_result_payload(result, provider="p", tool="memory_recall"), provider="p"
    )
    kept, invalid = split_items(payload)
    assert kept == [] and invalid == 3
    assert math.isinf(payload["items"][2]["score"])


def test_an_id_of_exactly_128_characters_is_kept() -> None:
    kept, _ = split_items({"items": [{"id": "i" * 128, "text": "t"}]})
    assert [item.id for item in kept] == ["i" * 128]


# --- contract version and tools --------------------------------------------------------------------


def test_contract_1_is_supported() -> None:
    info = check_contract({"contract": 1, "provider": {"name": "zep", "version": "0.9"}}, provider="zep")
    assert info == ProviderInfo(contract=1, name="zep", version="0.9")


@pytest.mark.errors
def test_contract_2_is_incompatible() -> None:
    with pytest.raises(ProviderIncompatible, match="contract 2") as info:
        check_contract({"contract": 2, "provider": {"name": "zep", "version": "2"}}, provider="zep")
    assert info.value.code == "FAILED_PRECONDITION"
    assert info.value.context == {"provider": "zep", "contract": 2}


def test_a_malformed_contract_answer_is_a_schema_error() -> None:
    with pytest.raises(ProviderSchemaError):
        check_contract({"version": 1}, provider="zep")


def test_missing_tools_lists_absent_contract_tools_in_order() -> None:
    assert missing_tools(["memory_recall", "memory_record_episode", "other"]) == [
        "memory_contract",
        "memory_forget",
    ]
    assert missing_tools(TOOLS) == []


# --- request bounds --------------------------------------------------------------------------------


def _recall(**overrides: object) -> dict:
    request: dict = {"query": "flaky test", "scope": ["project:forge.example/acme/api"], "limit": 5}
    request.update(overrides)
    return request


def test_canonical_requests_pass() -> None:
    episode, text = synthetic_episode("abc123")
    check_request("memory_contract", {})
    check_request(
        "memory_record_episode",
        {
            "episode_id": episode["episode_id"],
            "scope": episode["scope"],
            "trust_class": "standard",
            "episode": episode,
            "text": text,
        },
    )
    check_request("memory_recall", _recall(paths=["src/app.py", "README.md"], query="q" * 512))
    check_request("memory_recall", _recall(scope=["project:a", "project:b"], limit=20))
    check_request("memory_forget", {"id": "ep_0123456789abcdef0123"})


@pytest.mark.errors
@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("memory_recall", _recall(query="q" * 513), "query"),
        ("memory_recall", _recall(scope=[]), "scope"),
        ("memory_recall", _recall(scope=["project:a", "project:b", "project:c"]), "scope"),
        ("memory_recall", _recall(limit=0), "limit"),
        ("memory_recall", _recall(limit=21), "limit"),
        ("memory_recall", _recall(paths=[f"f{i}.py" for i in range(21)]), "paths"),
        ("memory_recall", _recall(paths=["ok.py", "/etc/passwd"]), "paths[1]"),
        ("memory_recall", _recall(paths=["src/../../secret"]), "paths[0]"),
        ("memory_recall", _recall(paths=[""]), "paths[0]"),
        ("memory_recall", _recall(limit="5"), "limit"),
        ("memory_recall", {"query": "q", "scope": ["project:a"]}, "limit"),
        ("memory_recall", _recall(extra=1), "extra"),
        ("memory_forget", {}, "id"),
        ("memory_contract", {"x": 1}, "x"),
        (
            "memory_record_episode",
            {
                "episode_id": "ep_XYZ",
                "scope": "project:a",
                "trust_class": "standard",
                "episode": {},
                "text": "",
            },
            "episode_id",
        ),
        (
            "memory_record_episode",
            {
                "episode_id": "ep_0123456789abcdef0123",
                "scope": "fleet",
                "trust_class": "standard",
                "episode": {},
                "text": "",
            },
            "scope",
        ),
    ],
)
def test_request_bound_violations_raise_invalid_argument_naming_the_field(
    tool: str, arguments: dict, field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_request(tool, arguments)
    assert info.value.context["field"] == field
    assert info.value.code == "INVALID_ARGUMENT"


def test_an_episode_missing_a_req5_field_is_rejected_by_name() -> None:
    episode, text = synthetic_episode("abc123")
    del episode["verify_failures"]
    with pytest.raises(InvalidArgument) as info:
        check_request(
            "memory_record_episode",
            {
                "episode_id": episode["episode_id"],
                "scope": episode["scope"],
                "trust_class": "standard",
                "episode": episode,
                "text": text,
            },
        )
    assert info.value.context["field"] == "episode.verify_failures"


def test_an_unknown_tool_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        check_request("memory_edit", {})
