"""SPEC-0030 REQ-4: the provider conformance check, run against the real fault provider subprocess."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from mcp import Client

from memactors.conformance import (
    CHECK_NAMES,
    ConformanceReport,
    format_report,
    run_conformance,
    synthetic_episode,
    synthetic_scope,
)
from memactors.testing import fault_provider_params

pytestmark = [pytest.mark.req4, pytest.mark.slow]

NONCE = "0123abcd4567ef89"


@attrs.frozen
class Run:
    report: ConformanceReport
    calls: list[dict[str, Any]]
    stored: dict[str, Any]

    def status(self, number: int) -> str:
        return self.report.checks[number - 1].status

    def tools_called(self) -> list[str]:
        return [call["tool"] for call in self.calls]


async def _check(
    tmp_path: Path, *modes: str, provider_timeout: float = 1.0, delay: float | None = None
) -> Run:
    calls, state = tmp_path / "calls.jsonl", tmp_path / "state.json"
    params = fault_provider_params(*modes, calls_file=calls, state_file=state, delay=delay)
    async with Client(params) as client:
        report = await run_conformance(
            client, provider="fault", provider_timeout=provider_timeout, nonce=NONCE
        )
    recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    stored = json.loads(state.read_text())["items"] if state.exists() else {}
    assert [c.number for c in report.checks] == list(range(1, 8))
    assert [c.name for c in report.checks] == [CHECK_NAMES[n] for n in range(1, 8)]
    return Run(report, recorded, stored)


def _assert_everything_recorded_was_forgotten(run: Run) -> None:
    recorded_ids = {c["arguments"]["episode_id"] for c in run.calls if c["tool"] == "memory_record_episode"}
    forgotten_ids = {c["arguments"]["id"] for c in run.calls if c["tool"] == "memory_forget"}
    assert recorded_ids <= forgotten_ids
    assert run.stored == {}, "the provider still holds a synthetic episode"


async def test_req4_a_conforming_provider_passes_every_check(tmp_path: Path) -> None:
    run = await _check(tmp_path)
    assert [c.status for c in run.report.checks] == ["pass"] * 7, format_report(run.report)
    assert run.report.ok
    assert (run.report.contract, run.report.provider_name) == (1, "fault")
    _assert_everything_recorded_was_forgotten(run)
    # the synthetic episode went to the synthetic scope, carrying the nonce in its text
    record = next(c["arguments"] for c in run.calls if c["tool"] == "memory_record_episode")
    assert record["scope"] == synthetic_scope(NONCE) == f"project:conformance.invalid/harness/check-{NONCE}"
    assert NONCE in record["text"]
    assert record["episode_id"] == synthetic_episode(NONCE)[0]["episode_id"]
    recalls = [c["arguments"] for c in run.calls if c["tool"] == "memory_recall"]
    assert recalls[1]["scope"] == [f"project:conformance.invalid/harness/other-{NONCE}"]


async def test_req4_a_provider_that_ignores_scope_passes_with_a_warning(tmp_path: Path) -> None:
    run = await _check(tmp_path, "other_scope")
    assert run.status(5) == "warn"
    assert "does not filter by scope" in run.report.checks[4].reason
    assert run.report.ok
    assert {c.status for c in run.report.checks[:4] + run.report.checks[5:]} == {"pass"}
    _assert_everything_recorded_was_forgotten(run)


async def test_req4_a_provider_without_memory_contract_fails(tmp_path: Path) -> None:
    run = await _check(tmp_path, "omit_contract")
    assert run.status(1) == "fail"
    assert "no memory_contract tool" in run.report.checks[0].reason
    assert not run.report.ok
    assert "memory_record_episode" not in run.tools_called()
    assert run.calls == []  # not a single tool call reached it
    assert "FAILED" in format_report(run.report)


async def test_an_unsupported_contract_fails_check_1_and_records_nothing(tmp_path: Path) -> None:
    run = await _check(tmp_path, "contract_v2")
    assert run.status(1) == "fail" and "contract 2" in run.report.checks[0].reason
    assert run.tools_called() == ["memory_contract"]
    assert not run.report.ok
    assert run.report.contract == 2  # what the provider said stays visible to the operator


async def test_a_provider_missing_memory_forget_fails_check_2_and_records_nothing(tmp_path: Path) -> None:
    run = await _check(tmp_path, "omit_forget")
    assert run.status(2) == "fail" and "memory_forget" in run.report.checks[1].reason
    assert "memory_record_episode" not in run.tools_called()


async def test_a_provider_that_keeps_forgotten_episodes_warns_on_check_6(tmp_path: Path) -> None:
    run = await _check(tmp_path, "ignore_forget")
    assert run.status(6) == "warn"
    assert run.report.ok
    episode_id = synthetic_episode(NONCE)[0]["episode_id"]
    assert {"tool": "memory_forget", "arguments": {"id": episode_id}} in run.calls
    assert run.report.unforgotten_ids == ()  # forget answered; the provider is the one keeping it


async def test_a_hanging_provider_fails_within_bounded_time_and_is_still_sent_a_forget(
    tmp_path: Path,
) -> None:
    run = await _check(tmp_path, "hang", provider_timeout=0.2)
    assert run.status(1) == "pass"  # memory_contract answers in hang mode
    # bounded by the per-call deadline (3 x provider_timeout, at least 1 s), not by the provider
    assert run.status(3) == "fail" and "did not answer within 1s" in run.report.checks[2].reason
    assert {run.status(n) for n in (4, 5, 6)} == {"skip"}
    assert not run.report.ok
    assert run.tools_called()[-1] == "memory_forget"
    assert run.stored == {}


async def test_a_provider_that_hangs_on_recall_fails_check_4_and_still_forgets(tmp_path: Path) -> None:
    run = await _check(tmp_path, "hang_recall", provider_timeout=0.2)
    assert run.status(3) == "pass" and run.status(4) == "fail"
    assert not run.report.ok
    _assert_everything_recorded_was_forgotten(run)


async def test_a_slow_provider_warns_on_check_4(tmp_path: Path) -> None:
    run = await _check(tmp_path, "slow", provider_timeout=0.2, delay=0.3)
    assert run.status(4) == "warn" and "over provider_timeout" in run.report.checks[3].reason
    assert run.report.ok
    _assert_everything_recorded_was_forgotten(run)


async def test_a_whole_invalid_recall_fails_checks_4_and_7(tmp_path: Path) -> None:
    run = await _check(tmp_path, "whole_invalid")
    assert run.status(4) == "fail" and run.status(7) == "fail"
    assert "memory_recall" in run.report.checks[6].reason
    _assert_everything_recorded_was_forgotten(run)


async def test_invalid_items_are_dropped_not_fatal(tmp_path: Path) -> None:
    run = await _check(tmp_path, "invalid_items", "extra_ids", "text_only")
    assert run.report.ok, format_report(run.report)
    assert "3 invalid item(s) dropped" in run.report.checks[3].reason
    _assert_everything_recorded_was_forgotten(run)


async def test_a_provider_that_errors_fails_without_raising(tmp_path: Path) -> None:
    run = await _check(tmp_path, "error")
    assert run.status(1) == "fail" and "failed on purpose" in run.report.checks[0].reason
    assert "memory_record_episode" not in run.tools_called()


async def test_a_provider_that_dies_on_record_fails_check_3(tmp_path: Path) -> None:
    run = await _check(tmp_path, "exit_on_record", provider_timeout=0.2)
    assert run.status(3) == "fail"
    assert not run.report.ok
    assert run.stored == {}


async def test_cancelling_the_check_still_forgets_what_was_recorded(tmp_path: Path) -> None:
    calls, state, control = tmp_path / "calls.jsonl", tmp_path / "state.json", tmp_path / "control"
    control.write_text("hang_recall")  # recording works, then the suite waits on recall ...
    params = fault_provider_params(calls_file=calls, state_file=state, control_file=control)
    check = functools.partial(run_conformance, provider="fault", provider_timeout=5.0, nonce=NONCE)
    async with Client(params) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(check, client)
            await _wait_until(lambda: '"memory_recall"' in (calls.read_text() if calls.exists() else ""))
            assert json.loads(state.read_text())["items"] != {}
            control.write_text("")  # ... and the provider answers the cleanup's forget
            nursery.cancel_scope.cancel()
    assert json.loads(state.read_text())["items"] == {}
    forgets = [line for line in calls.read_text().splitlines() if '"memory_forget"' in line]
    assert len(forgets) == 1


async def _wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition another process makes true (a file it writes); there is no event to wait on."""
    for _ in range(3000):  # a hang guard, not a timing: generous for a loaded machine
        if condition():
            return
        await trio.sleep(0.02)
    raise AssertionError("condition not met within 60 s")


def test_format_report_is_a_table_and_the_report_is_json_able() -> None:
    from memactors.conformance import CheckResult

    report = ConformanceReport(
        provider="zep",
        checks=tuple(CheckResult(n, CHECK_NAMES[n], "warn" if n == 5 else "pass") for n in range(1, 8)),
        contract=1,
        provider_name="zep",
        provider_version="0.9",
    )
    text = format_report(report)
    assert text.splitlines()[0] == "provider zep: zep 0.9, contract 1"
    assert "  5  WARN  " in text and text.splitlines()[-1] == "ok (1 warning(s))"
    assert json.loads(json.dumps(attrs.asdict(report)))["checks"][4]["status"] == "warn"
