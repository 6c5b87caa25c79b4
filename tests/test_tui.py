"""REQ-19's TUI overlay: B opens GetBriefing read-only, r recomputes, esc closes."""

from __future__ import annotations

import pytest

from memactors.service import open_memory_service
from memactors.tui import ESC, HarnessEntry, TuiApp
from support import example, wait_ready

HARNESS = '[harness.api-fixer]\nharness = "claude-code"\nprompt = "fix it"\nmemory_briefing = true\n'


@pytest.mark.req19
async def test_req19_the_tui_preview_shows_degraded_state(make_holder) -> None:  # type: ignore[no-untyped-def]
    """The provider is down (its command cannot start): the overlay still shows the deterministic
    sections and marks episodes provider_unavailable."""
    down = '[memory]\nprovider = "gone"\n[mcp.gone]\ncommand = "/nonexistent/memory-provider"\n'
    async with open_memory_service(make_holder(down + HARNESS)) as memory:
        # The session starts "connecting" and turns "down" once its spawn fails: wait for the state the
        # overlay is asserted to show (this raced under load when it read the status straight away).
        await wait_ready(memory, "down")
        await memory.ingest_run(example("run-42-api-fixer.json"))
        await memory.add_fact(scope="project:forge.example/acme/api", text="ledger tests need -race",
                              confidence=0.9)
        app = TuiApp([HarnessEntry("api-fixer", "claude-code", True)])
        wanted = app.key("B")
        assert wanted == "api-fixer"
        app.loaded(await memory.get_briefing(wanted), await memory.status())
        text = "\n".join(app.lines())
        assert "provider gone: down" in text
        assert "provider_unavailable" in text
        assert "memory_briefing: yes" in text
        for section in ("collisions", "recent_runs", "facts", "episodes"):
            assert section in text
        assert "ledger tests need -race" in text  # the deterministic facts section is there
        assert app.key("r") == "api-fixer"  # recompute asks for a fresh GetBriefing
        app.key(ESC)
        assert app.overlay is None
        assert "> api-fixer" in "\n".join(app.lines())


def test_navigation_and_quit() -> None:
    app = TuiApp([HarnessEntry("a", "codex", False), HarnessEntry("b", "claude-code", True)])
    app.key("j")
    assert app.selected == 1
    app.key("j")
    assert app.selected == 1
    app.key("k")
    assert app.selected == 0
    app.failed("daemon not reachable")
    assert app.lines()[0] == "error: daemon not reachable"
    app.key(ESC)
    app.key("q")
    assert app.quit
