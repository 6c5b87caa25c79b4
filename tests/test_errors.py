"""SPEC-0030 "Error Handling Standards": provider failures are attributable, queued, never swallowed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from loguru import logger

from memactors import errors
from memactors.service import open_memory_service
from support import example, wait_ready


def _zep(tmp_path: Path, control: Path) -> str:
    args = ["-m", "memactors.testing.fault_provider", "--control", str(control)]
    return (f'[memory]\nprovider = "zep"\n[mcp.zep]\ncommand = "{sys.executable}"\n'
            f"args = {args!r}\n".replace("'", '"'))


@pytest.mark.errors
async def test_a_provider_error_is_attributable(tmp_path: Path, make_holder) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "modes"
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), format="{message} {extra}", level="DEBUG")
    try:
        async with open_memory_service(make_holder(_zep(tmp_path, control))) as memory:
            await wait_ready(memory)
            await trio.Path(control).write_text("error")
            result = await memory.ingest_run(example("run-42-api-fixer.json"))
            status = await memory.status()
    finally:
        logger.remove(sink)
    episode_id = result["episode_id"]
    assert result["outcome"] == "queued"
    assert status["pending"]["records"] == 1  # queued for retry, not lost
    failures = [line for line in lines if line.startswith("episode record failed")]
    assert failures, lines
    assert "'provider': 'zep'" in failures[0]
    assert f"'episode': '{episode_id}'" in failures[0]
    assert "failed on purpose" in failures[0]  # the provider's (redacted) message
    assert "TestLedgerReconcile" not in "\n".join(lines)  # no episode body in logs


def test_the_sentinels_exist_with_a_docstring_each() -> None:
    for name in ("ProviderUnavailable", "ProviderIncompatible", "ProviderReserved", "UnknownEpisode",
                 "NotAttributed", "NoRepository"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.MemactorsError)
        assert (cls.__doc__ or "").startswith("Raised when")
    wrapped = errors.ProviderUnavailable("record failed", provider="zep", episode="ep_1")
    assert str(wrapped) == "record failed (episode=ep_1 provider=zep)"
