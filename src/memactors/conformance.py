"""SPEC-0030 REQ-4: the provider conformance suite behind ``memactors memory provider check``.

`run_conformance` runs REQ-4's seven checks, in order, on an MCP client that is already connected to
the provider, and returns a `ConformanceReport`. It records one synthetic episode in the scope
``project:conformance.invalid/harness/check-<nonce>`` and forgets every id it recorded before it returns,
on success, on failure and on cancellation alike (the cleanup runs shielded under a bounded deadline).

The suite talks to the provider and to nothing else: it has no access to the daemon's store, so
synthetic episodes never enter REQ-9's index.

Every call runs under its own deadline (three times ``provider_timeout``, at least one second), so a
hanging provider makes a check fail with a reason instead of hanging the command.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from typing import Any, Literal

import attrs
import jsonschema
import mcp
import trio
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for
from loguru import logger

from .contract import (
    TOOLS,
    ProviderError,
    ProviderInfo,
    ProviderSchemaError,
    check_contract,
    split_items,
    tool_result_payload,
    validate_response,
)
from .errors import ProviderIncompatible

Status = Literal["pass", "warn", "fail", "skip"]

CHECK_NAMES: dict[int, str] = {
    1: "memory_contract answers a supported version",
    2: "each tool's inputSchema accepts Harness's canonical requests",
    3: "recording a synthetic episode returns 1 to 32 ids",
    4: "recalling the nonce returns a recorded id within provider_timeout",
    5: "recalling under another scope does not return the ids",
    6: "after memory_forget, recall returns none of the ids",
    7: "every response validates against its schema",
}

#: Floor of the per-call deadline, so a tiny provider_timeout still leaves a live provider time to answer.
MIN_CALL_DEADLINE = 1.0


@attrs.frozen
class CheckResult:
    """One check's outcome. ``skip`` means an earlier check failed and this one could not run."""

    number: int
    name: str
    status: Status
    reason: str = ""


@attrs.frozen
class ConformanceReport:
    """The seven results, plus what ``memory_contract`` said and how cleanup went."""

    provider: str
    checks: tuple[CheckResult, ...]
    contract: int | None = None
    provider_name: str | None = None
    provider_version: str | None = None
    #: Recorded ids whose forget did not get a valid answer before the cleanup deadline.
    unforgotten_ids: tuple[str, ...] = ()
    #: When a check failed: the provider's last stderr lines (a stdio provider's traceback), redacted.
    stderr_tail: tuple[str, ...] = ()
    #: When check 1 failed: where to read what a memory provider must be.
    help: str | None = None

    @property
    def ok(self) -> bool:
        """False when any check failed; the CLI exits non-zero then (warnings keep it at zero)."""
        return not any(check.status == "fail" for check in self.checks)


def synthetic_scope(nonce: str) -> str:
    """The scope the suite records in; ``conformance.invalid`` can never be a real repository host."""
    return f"project:conformance.invalid/harness/check-{nonce}"


def other_scope(nonce: str) -> str:
    """A second synthetic scope nothing was recorded in (check 5)."""
    return f"project:conformance.invalid/harness/other-{nonce}"


def synthetic_episode(nonce: str) -> tuple[dict[str, Any], str]:
    """A valid REQ-5 episode for the nonce and its plain-text rendering (which contains the nonce)."""
    digest = hashlib.sha256(nonce.encode("utf-8")).hexdigest()
    scope = synthetic_scope(nonce)
    episode: dict[str, Any] = {
        "episode_id": f"ep_{digest[:20]}",
        "harness": "conformance",
        "adapter": "conformance",
        "run_id": f"check-{nonce}",
        "trace_id": digest[:32],
        "model": "none",
        "repo": scope.removeprefix("project:"),
        "branch": "main",
        "outcome": "succeeded",
        "reason": "completed",
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_ms": 0,
        "cost_usd": 0.0,
        "cost_source": "unknown",
        "files_touched": ["README.md"],
        "pull_request": None,
        "verify_failures": [],
        "result_excerpt": f"conformance check {nonce}",
        "summary": None,
        "trust_class": "standard",
        "scope": scope,
    }
    text = "\n".join(f"{key}: {_render(value)}" for key, value in episode.items())
    return episode, text


def _render(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(_render(v) for v in value)
    return str(value)


class _CallFailed(Exception):
    """A suite call that produced no usable answer; ``reason`` is safe to show an operator."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.define
class _Suite:
    client: mcp.Client
    provider: str
    provider_timeout: float
    nonce: str
    call_deadline: float
    results: dict[int, CheckResult] = attrs.Factory(dict)
    recorded: list[str] = attrs.Factory(list)
    forgotten: set[str] = attrs.Factory(set)
    responses_valid: int = 0
    schema_failures: list[str] = attrs.Factory(list)
    info: ProviderInfo | None = None

    def put(self, number: int, status: Status, reason: str = "") -> None:
        self.results[number] = CheckResult(number, CHECK_NAMES[number], status, reason)

    def skip_from(self, first: int, reason: str) -> None:
        for number in range(first, 7):
            if number not in self.results:
                self.put(number, "skip", reason)

    async def call_raw(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call ``tool`` under the per-call deadline and return its JSON payload, unvalidated."""
        with trio.move_on_after(self.call_deadline):
            try:
                result = await self.client.call_tool(tool, arguments)
                return tool_result_payload(result, provider=self.provider, tool=tool)
            except ProviderSchemaError as exc:
                self.schema_failures.append(f"{tool}: {exc.message}")
                raise _CallFailed(f"invalid response: {exc.message}") from None
            except ProviderError as exc:
                raise _CallFailed(exc.message) from None
            except Exception as exc:  # transport failures: the provider died, the pipe broke
                raise _CallFailed(f"{tool} call failed: {type(exc).__name__}") from None
        raise _CallFailed(f"{tool} did not answer within {self.call_deadline:g}s")

    def validate(self, tool: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Validate a payload against its shipped schema, remembering the outcome for check 7."""
        try:
            validate_response(tool, payload, provider=self.provider)
        except ProviderSchemaError as exc:
            self.schema_failures.append(f"{tool}: {exc.message}")
            raise _CallFailed(f"invalid response: {exc.message}") from None
        self.responses_valid += 1
        return payload

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call ``tool`` and return its schema-valid payload; raise _CallFailed with a reason otherwise."""
        return self.validate(tool, await self.call_raw(tool, arguments))

    # --- the checks ------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            listed = await self._list_tools()
        except _CallFailed as exc:
            self.put(1, "fail", exc.reason)
            self.skip_from(2, "tools/list failed")
            return
        if not await self._check_contract(listed):
            self.skip_from(2, "check 1 failed: nothing is recorded to an incompatible provider")
            return
        if not self._check_schemas(listed):
            self.skip_from(3, "check 2 failed: nothing is recorded to an incompatible provider")
            return
        if not await self._check_record():
            self.skip_from(4, "check 3 failed: nothing was recorded")
            return
        if not await self._check_recall():
            self.skip_from(5, "check 4 failed: this check needs a recall that finds the synthetic episode")
            return
        await self._check_scope()
        await self._check_forget()

    async def _list_tools(self) -> dict[str, dict[str, Any]]:
        with trio.move_on_after(self.call_deadline):
            try:
                tools = (await self.client.list_tools()).tools
            except Exception as exc:
                raise _CallFailed(f"tools/list failed: {type(exc).__name__}") from None
            return {tool.name: dict(tool.input_schema or {}) for tool in tools}
        raise _CallFailed(f"tools/list did not answer within {self.call_deadline:g}s")

    async def _check_contract(self, listed: dict[str, dict[str, Any]]) -> bool:
        if "memory_contract" not in listed:
            offered = sorted(listed)
            shown = ", ".join(name[:64] for name in offered[:6]) + (", …" if len(offered) > 6 else "")
            what = f"it offers {len(offered)} other tool(s): {shown}" if offered else "it offers no tools"
            self.put(1, "fail", f"the provider has no memory_contract tool ({what}): it is an MCP server but "
                                "not a memactors memory provider")
            return False
        try:
            payload = await self.call("memory_contract", {})
            self.info = check_contract(payload, provider=self.provider)
        except _CallFailed as exc:
            self.put(1, "fail", exc.reason)
            return False
        except ProviderIncompatible as exc:
            # Keep what it said for the report: the version is what an operator needs to see.
            self.info = ProviderInfo(
                payload["contract"], payload["provider"]["name"], payload["provider"]["version"]
            )
            self.put(1, "fail", exc.message)
            return False
        self.put(1, "pass", f"contract {self.info.contract} ({self.info.name} {self.info.version})")
        return True

    def canonical_requests(self) -> dict[str, list[dict[str, Any]]]:
        episode, text = synthetic_episode(self.nonce)
        scope = synthetic_scope(self.nonce)
        return {
            "memory_contract": [{}],
            "memory_record_episode": [
                {
                    "episode_id": episode["episode_id"],
                    "scope": scope,
                    "trust_class": "standard",
                    "episode": episode,
                    "text": text,
                }
            ],
            "memory_recall": [
                {"query": self.nonce, "scope": [scope], "limit": 20},
                {
                    "query": self.nonce,
                    "scope": [scope, other_scope(self.nonce)],
                    "limit": 5,
                    "paths": ["README.md"],
                },
            ],
            "memory_forget": [{"id": episode["episode_id"]}],
        }

    def _check_schemas(self, listed: dict[str, dict[str, Any]]) -> bool:
        problems: list[str] = []
        missing = [tool for tool in TOOLS if tool not in listed]
        if missing:
            problems.append("missing tools: " + ", ".join(missing))
        for tool, requests in self.canonical_requests().items():
            if tool not in listed:
                continue
            problems += _schema_problems(tool, listed[tool], requests)
        if problems:
            self.put(2, "fail", "; ".join(problems))
            return False
        self.put(2, "pass")
        return True

    async def _check_record(self) -> bool:
        request = self.canonical_requests()["memory_record_episode"][0]
        # Until the provider names its ids, the episode id is the best guess of what it stored: a
        # provider that stores and then fails or hangs still gets a forget for it.
        self.recorded.append(request["episode_id"])
        try:
            payload = await self.call_raw("memory_record_episode", request)
            ids = payload.get("ids")
            if isinstance(ids, list):  # forget whatever it named, even in a response that is invalid
                self.recorded += [i for i in ids[:64] if isinstance(i, str) and i and i not in self.recorded]
            self.validate("memory_record_episode", payload)
        except _CallFailed as exc:
            self.put(3, "fail", exc.reason)
            return False
        if request["episode_id"] not in payload["ids"]:
            self.recorded.remove(request["episode_id"])
        self.put(3, "pass", f"{len(payload['ids'])} id(s)")
        return True

    async def _recall(self, scopes: list[str]) -> tuple[set[str], float, int]:
        """Recall the nonce under ``scopes``: the recorded ids among valid items, seconds taken, invalid count."""
        started = trio.current_time()
        payload = await self.call("memory_recall", {"query": self.nonce, "scope": scopes, "limit": 20})
        elapsed = trio.current_time() - started
        items, invalid = split_items(payload)
        return {item.id for item in items} & set(self.recorded), elapsed, invalid

    async def _check_recall(self) -> bool:
        try:
            found, elapsed, invalid = await self._recall([synthetic_scope(self.nonce)])
        except _CallFailed as exc:
            self.put(4, "fail", exc.reason)
            return False
        dropped = f"; {invalid} invalid item(s) dropped" if invalid else ""
        if not found:
            self.put(4, "fail", f"recall of the nonce returned none of the recorded ids{dropped}")
            return False
        if elapsed > self.provider_timeout:
            timing = f"answered in {elapsed:.2f}s, over provider_timeout {self.provider_timeout:g}s"
            self.put(4, "warn", timing + dropped)
        else:
            self.put(4, "pass", f"answered in {elapsed:.2f}s{dropped}")
        return True

    async def _check_scope(self) -> None:
        try:
            found, _elapsed, _invalid = await self._recall([other_scope(self.nonce)])
        except _CallFailed as exc:
            self.put(5, "fail", exc.reason)
            return
        if found:
            self.put(5, "warn", "the provider does not filter by scope; Harness will (REQ-9)")
        else:
            self.put(5, "pass")

    async def _check_forget(self) -> None:
        failures = await self._forget_all()
        if failures:
            self.put(6, "fail", "; ".join(failures))
            return
        try:
            found, _elapsed, _invalid = await self._recall([synthetic_scope(self.nonce)])
        except _CallFailed as exc:
            self.put(6, "fail", exc.reason)
            return
        if found:
            self.put(6, "warn", "the provider does not forget; Harness tombstones (REQ-10)")
        else:
            self.put(6, "pass")

    async def _forget_all(self) -> list[str]:
        """Forget every recorded id not yet forgotten, concurrently; return the reasons of failed forgets."""
        failures: list[str] = []

        async def forget(item_id: str) -> None:
            try:
                await self.call("memory_forget", {"id": item_id})
            except _CallFailed as exc:
                failures.append(exc.reason)
            else:
                self.forgotten.add(item_id)

        async with trio.open_nursery() as nursery:
            for item_id in self.recorded:
                if item_id not in self.forgotten:
                    nursery.start_soon(forget, item_id)
        return failures

    def finish_check7(self) -> None:
        if self.schema_failures:
            self.put(7, "fail", "; ".join(self.schema_failures))
        elif self.responses_valid:
            self.put(7, "pass", f"{self.responses_valid} response(s) valid")
        else:
            self.put(7, "skip", "no response to validate")


def _schema_problems(tool: str, schema: dict[str, Any], requests: list[dict[str, Any]]) -> list[str]:
    """Why ``schema`` (a provider's inputSchema) rejects any of ``requests``; empty when it accepts them all."""
    try:
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        validator = cls(schema)
    except (jsonschema.SchemaError, TypeError) as exc:
        return [f"{tool} inputSchema is not a valid JSON Schema ({type(exc).__name__})"]
    problems: list[str] = []
    for request in requests:
        error = best_match(validator.iter_errors(request))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "<root>"
            problems.append(
                f"{tool} inputSchema rejects the canonical request at {where} ({error.validator})"
            )
    return problems


async def run_conformance(
    client: mcp.Client, *, provider: str, provider_timeout: float, nonce: str | None = None
) -> ConformanceReport:
    """Run REQ-4's seven checks against the provider behind ``client`` and report each.

    Never raises for provider misbehaviour (it becomes a failed check); cancellation propagates, after
    the shielded cleanup that forgets every recorded id.
    """
    suite = _Suite(
        client=client,
        provider=provider,
        provider_timeout=provider_timeout,
        nonce=nonce or secrets.token_hex(8),
        call_deadline=max(3 * provider_timeout, MIN_CALL_DEADLINE),
    )
    try:
        await suite.run()
    finally:
        # Forget whatever is still recorded, even when the run failed or was cancelled. Bounded: one
        # concurrent round of forgets under the per-call deadline, plus slack.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + suite.call_deadline + 1.0):
            if any(item_id not in suite.forgotten for item_id in suite.recorded):
                await suite._forget_all()
    suite.finish_check7()
    unforgotten = tuple(i for i in suite.recorded if i not in suite.forgotten)
    report = ConformanceReport(
        provider=provider,
        checks=tuple(suite.results[n] for n in sorted(suite.results)),
        contract=suite.info.contract if suite.info else None,
        provider_name=suite.info.name if suite.info else None,
        provider_version=suite.info.version if suite.info else None,
        unforgotten_ids=unforgotten,
    )
    logger.bind(
        provider=provider,
        ok=report.ok,
        failed=sum(c.status == "fail" for c in report.checks),
        warned=sum(c.status == "warn" for c in report.checks),
        recorded=len(suite.recorded),
        unforgotten=len(unforgotten),
    ).info("provider conformance check finished")
    return report


#: Where a failed check 1 points: the page that says what a provider is and how to write one.
HELP_DOC = "docs/write-a-provider.md"


def explain_failure(report: ConformanceReport, stderr_tail: tuple[str, ...]) -> ConformanceReport:
    """A failed report with what explains it: the provider's last stderr lines (already redacted) and,
    when check 1 failed, the pointer to the provider documentation. A passing report is left alone."""
    if report.ok:
        return report
    first = report.checks[0] if report.checks else None
    if first is not None and stderr_tail and first.status == "fail" and "Connection closed" in first.reason:
        # the process ended before it answered: what it printed is the reason, shown under this check
        first = attrs.evolve(first, reason=f"{first.reason} (the provider exited; its stderr says why)")
        report = attrs.evolve(report, checks=(first, *report.checks[1:]))
    help_text = None
    if first is not None and first.number == 1 and first.status == "fail":
        help_text = (f"a memory provider is an MCP server with the tools memory_contract, memory_record_episode, "
                     f"memory_recall and memory_forget: see {HELP_DOC} in the memactors repository")
    return attrs.evolve(report, stderr_tail=tuple(stderr_tail), help=help_text)


_MARK: dict[str, str] = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


def format_report(report: ConformanceReport) -> str:
    """The report as a human table, one row per check, then a verdict line."""
    lines = [
        f"provider {report.provider}"
        + (
            f": {report.provider_name} {report.provider_version}, contract {report.contract}"
            if report.contract is not None
            else ""
        )
    ]
    name_width = max(len(c.name) for c in report.checks) if report.checks else 0
    explained = False
    for check in report.checks:
        row = f"  {check.number}  {_MARK[check.status]:<4}  {check.name:<{name_width}}"
        lines.append(f"{row}  {check.reason}".rstrip() if check.reason else row.rstrip())
        if check.status == "fail" and not explained:  # why, under the first failing check
            explained = True
            if report.stderr_tail:
                lines.append(f"        the provider's stderr (last {len(report.stderr_tail)} line(s), redacted):")
                lines += [f"          {line}" for line in report.stderr_tail]
            if report.help:
                lines.append(f"        {report.help}")
    if report.unforgotten_ids:
        lines.append(
            f"  {len(report.unforgotten_ids)} synthetic id(s) not confirmed forgotten (the provider did not answer memory_forget)"
        )
    verdict = "ok" if report.ok else "FAILED"
    warned = sum(c.status == "warn" for c in report.checks)
    lines.append(f"{verdict}" + (f" ({warned} warning(s))" if warned else ""))
    return "\n".join(lines)
