"""`memactors tui`: harnesses on the left, B opens REQ-19's read-only briefing overlay.

The overlay shows exactly what MemoryService.GetBriefing returns — each section with its item count,
the bytes and characters used against `briefing_max_chars`, dropped counts, the provider state and
whether `memory_briefing` is set — then the document itself. `r` recomputes, `esc` closes, `q` quits.

`TuiApp` is the whole behaviour as plain state (keys in, lines out), so it is tested without a terminal;
`run_tui` only draws its lines with curses and performs the loads it asks for through the RPC.
"""

from __future__ import annotations

import curses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

ESC = 27


@attrs.frozen
class HarnessEntry:
    name: str
    adapter: str
    memory_briefing: bool


@attrs.define
class TuiApp:
    harnesses: Sequence[HarnessEntry]
    selected: int = 0
    overlay: Mapping[str, Any] | None = None
    status: Mapping[str, Any] | None = None
    error: str | None = None
    quit: bool = False

    def key(self, key: int | str) -> str | None:
        """Handle one key; returns the name of the harness whose briefing must be (re)loaded, if any."""
        k = key if isinstance(key, str) else (chr(key) if 0 <= key < 256 else "")
        if self.overlay is not None or self.error is not None:
            if key == ESC or k == "\x1b":
                self.overlay = self.error = None
            elif k == "r" and self.harnesses:
                return self.harnesses[self.selected].name
            elif k == "q":
                self.quit = True
            return None
        if k == "q":
            self.quit = True
        elif k in ("j",) or key == curses.KEY_DOWN:
            self.selected = min(self.selected + 1, max(len(self.harnesses) - 1, 0))
        elif k in ("k",) or key == curses.KEY_UP:
            self.selected = max(self.selected - 1, 0)
        elif k in ("B", "b") and self.harnesses:
            return self.harnesses[self.selected].name
        return None

    def loaded(self, briefing: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        self.overlay, self.status, self.error = briefing, status, None

    def failed(self, message: str) -> None:
        self.overlay, self.error = None, message

    def lines(self, width: int = 100) -> list[str]:
        if self.error is not None:
            return [f"error: {self.error}", "", "[esc] close"]
        if self.overlay is not None:
            return overlay_lines(self.overlay, self.status or {}, width=width)
        out = ["memactors — harnesses   [↑/↓] select  [B] briefing preview  [q] quit", ""]
        for i, h in enumerate(self.harnesses):
            mark = ">" if i == self.selected else " "
            out.append(f"{mark} {h.name:<24} {h.adapter:<14} memory_briefing={'yes' if h.memory_briefing else 'no'}")
        if not self.harnesses:
            out.append("  (no [harness.*] in the configuration)")
        return out


def overlay_lines(briefing: Mapping[str, Any], status: Mapping[str, Any], *, width: int = 100) -> list[str]:
    """The read-only overlay of one GetBriefing answer (REQ-19)."""
    structured = briefing.get("structured") or {}
    provider_state = status.get("state", "unknown")
    lines = [
        f"Briefing preview: {briefing['harness']} (read-only, no exposure recorded)",
        f"provider {briefing.get('provider')}: {provider_state}"
        + (f"   degraded: {briefing['degraded']}" if briefing.get("degraded") else ""),
        f"memory_briefing: {'yes' if briefing.get('memory_briefing') else 'no'}   "
        f"size: {briefing.get('chars', 0)} / {briefing.get('briefing_max_chars')} chars, "
        f"{briefing.get('bytes', 0)} / 4096 bytes",
        "",
        f"{'section':<14}{'items':>6}{'dropped':>9}  note",
    ]
    sections = structured.get("sections") or []
    for section in sections:
        note = section.get("note") or ""
        lines.append(f"{section['name']:<14}{len(section.get('items') or []):>6}{section.get('dropped', 0):>9}  {note}")
    if not sections:
        lines.append("(empty briefing)")
    lines += ["", "[r] recompute   [esc] close", "-" * min(width, 80)]
    lines += [line[:width] for line in (briefing.get("document") or "").splitlines()]
    return lines


def run_tui(
    harnesses: Sequence[HarnessEntry],
    load: Callable[[str], tuple[Mapping[str, Any], Mapping[str, Any]]],
) -> None:
    """Draw `TuiApp` with curses; `load(harness)` returns (GetBriefing answer, Status answer)."""
    app = TuiApp(harnesses)

    def main(screen: Any) -> None:
        curses.curs_set(0)
        screen.keypad(True)
        while not app.quit:
            height, width = screen.getmaxyx()
            screen.erase()
            for y, line in enumerate(app.lines(width - 1)[: height - 1]):
                screen.addnstr(y, 0, line, width - 1)
            screen.refresh()
            wanted = app.key(screen.getch())
            if wanted is not None:
                try:
                    app.loaded(*load(wanted))
                except Exception as exc:  # shown to the operator, never fatal to the TUI
                    app.failed(str(exc))

    curses.wrapper(main)
