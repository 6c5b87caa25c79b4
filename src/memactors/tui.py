"""`memactors tui`: harnesses, recent episodes, provider state and pending work; B opens REQ-19's
read-only briefing overlay.

The overlay shows exactly what MemoryService.GetBriefing returns — each section with its item count,
the bytes and characters used against `briefing_max_chars`, dropped counts, the provider state and
whether `memory_briefing` is set — then the document itself, wrapped to the terminal and scrollable
(↑/↓, PgUp/PgDn, Home/End). `r` recomputes, `esc` closes, `q` quits.

Two layers:

* `TuiState` is the whole behaviour as plain state: keys in, actions out (which RPC to make), answers
  in, lines out. It is tested without a terminal.
* `run_tui` draws it with urwid on urwid's trio event loop, in its own process, and performs the
  actions over the operator RPC (`rpc.connect_rpc`): the TUI has no private path into the daemon.
  docs/dependencies.md says why urwid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .documents import cut_at_word

ESC = "esc"
HELP_MAIN = "↑/↓ select  B briefing  r refresh  q quit"
HELP_OVERLAY = "↑/↓ PgUp/PgDn scroll  r recompute  esc close  q quit"
#: Recent episodes shown (one ListEpisodes page).
RECENT = 50
#: Widest gist under each recent episode (its ListEpisodes gist and files).
GIST_CHARS = 100


@attrs.frozen
class HarnessEntry:
    name: str
    adapter: str
    memory_briefing: bool
    configured: bool = True


@attrs.frozen
class Load:
    """An action for the driver: fetch a briefing (`harness`) or refresh the lists (`harness` None)."""

    harness: str | None = None


@attrs.define
class TuiState:
    configured: Sequence[HarnessEntry]
    selected: int = 0
    episodes: Sequence[Mapping[str, Any]] = ()
    total: int | None = None
    status: Mapping[str, Any] | None = None
    overlay: Mapping[str, Any] | None = None
    loading: str | None = None
    error: str | None = None
    daemon_error: str | None = None
    quit: bool = False

    @property
    def harnesses(self) -> list[HarnessEntry]:
        """The configured harnesses; with none configured, the harnesses seen in recent episodes (they
        can be listed, but a briefing needs a `[harness.<name>]` table)."""
        if self.configured:
            return list(self.configured)
        seen = sorted({str(e["harness"]) for e in self.episodes if e.get("harness")})
        return [HarnessEntry(name, "", False, configured=False) for name in seen]

    @property
    def in_overlay(self) -> bool:
        return self.overlay is not None or self.error is not None or self.loading is not None

    def key(self, key: str) -> Load | None:
        """Handle one key (urwid's names: "up", "esc", "B"); returns the load to perform, if any."""
        harnesses = self.harnesses
        if key in ("q", "Q"):
            self.quit = True
            return None
        if self.in_overlay:
            if key == ESC:
                self.overlay = self.error = self.loading = None
            elif key == "r" and harnesses:
                self.loading = harnesses[self.selected].name
                return Load(self.loading)
            return None
        if key in ("down", "j"):
            self.selected = min(self.selected + 1, max(len(harnesses) - 1, 0))
        elif key in ("up", "k"):
            self.selected = max(self.selected - 1, 0)
        elif key in ("B", "b", "enter") and harnesses:
            self.loading = harnesses[self.selected].name
            return Load(self.loading)
        elif key == "r":
            return Load()
        return None

    # -- answers from the driver --------------------------------------------------------------------------
    def refreshed(self, status: Mapping[str, Any] | None, listing: Mapping[str, Any] | None) -> None:
        self.status, self.daemon_error = status, None
        if listing is not None:
            self.episodes, self.total = list(listing.get("episodes") or ()), listing.get("total")
        self.selected = min(self.selected, max(len(self.harnesses) - 1, 0))

    def unreachable(self, message: str) -> None:
        self.daemon_error = message

    def loaded(self, briefing: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        if self.loading is None and self.overlay is None:
            return  # closed while it was loading
        self.overlay, self.status, self.error, self.loading = briefing, status, None, None

    def failed(self, message: str) -> None:
        if self.loading is None and self.overlay is None:
            return
        self.overlay, self.error, self.loading = None, message, None

    # -- what is drawn ---------------------------------------------------------------------------------------
    def header(self) -> str:
        if self.daemon_error:
            return f"memactors · daemon: {self.daemon_error}"
        st = self.status
        if st is None:
            return "memactors · connecting to the daemon…"
        p = st.get("pending") or {}
        # The provider's real state (Status's condition: the breaker only when it is ready, else since
        # when and the last error), not a breaker that a provider which is down never reaches.
        condition = st.get("condition") or f"{st.get('state')} · breaker {st.get('breaker')}"
        return (f"memactors · provider {st.get('provider')}: {condition} · "
                f"pending {p.get('records', 0)} records, {p.get('forgets', 0)} forgets"
                + (f" · failed {p.get('record_failed', 0)}/{p.get('forget_failed', 0)}"
                   if p.get("record_failed") or p.get("forget_failed") else ""))

    def harness_lines(self) -> list[str]:
        harnesses = self.harnesses
        if not harnesses:
            return ["(no [harness.*] configured", " and no episodes yet)"]
        out = []
        for i, h in enumerate(harnesses):
            mark = ">" if i == self.selected else " "
            if h.configured:
                out.append(f"{mark} {h.name}  {h.adapter}{'  +brief' if h.memory_briefing else ''}")
            else:
                out.append(f"{mark} {h.name}  (seen)")
        if not self.configured:
            out += ["", "seen in episodes; add a", "[harness.<name>] table", "to preview briefings"]
        return out

    def episode_lines(self) -> list[str]:
        if not self.episodes:
            return ["no episodes yet"]
        lines = []
        for e in self.episodes:
            lines.append(f"{str(e.get('started_at', ''))[:16].replace('T', ' ')}  {e.get('harness', '')}"
                         f"  run {e.get('run_id')}  {e.get('outcome', '')}  {e.get('repo', '')}@{e.get('branch', '')}")
            said = episode_gist(e)
            if said:  # what the run said and touched, as the console's list shows it
                lines.append(f"    {said}")
        if self.total is not None and self.total > len(self.episodes):
            lines.append(f"… {self.total - len(self.episodes)} older (memactors memory episodes)")
        return lines

    def overlay_lines(self) -> list[str]:
        if self.error is not None:
            return [f"error: {self.error}"]
        if self.overlay is None:
            return [f"loading the briefing for {self.loading}…"]
        return overlay_lines(self.overlay, self.status or {})

    def help_line(self) -> str:
        return HELP_OVERLAY if self.in_overlay else HELP_MAIN

    def lines(self) -> list[str]:
        """Everything as plain lines (what a test reads): the overlay when open, else the main view."""
        if self.in_overlay:
            return [*self.overlay_lines(), "", self.help_line()]
        return [self.header(), "", "Harnesses", *self.harness_lines(), "", "Recent episodes",
                *self.episode_lines(), "", self.help_line()]


def episode_gist(row: Mapping[str, Any], width: int = GIST_CHARS) -> str:
    """A ListEpisodes row's gist (the run's own first words) and the files it touched, in ``width``
    characters: what the episode list says of each episode, in the TUI as in the console."""
    said = str(row.get("gist") or "")
    files = [str(f) for f in row.get("files") or ()]
    more = int(row.get("files_total") or len(files)) - len(files)
    touched = ("touched " + ", ".join(files) + (f", +{more}" if more > 0 else "")) if files else ""
    text = " · ".join(p for p in (said, touched) if p)
    return cut_at_word(text, width) if len(text) > width else text


def overlay_lines(briefing: Mapping[str, Any], status: Mapping[str, Any]) -> list[str]:
    """The read-only overlay of one GetBriefing answer (REQ-19); long lines are wrapped by the view."""
    structured = briefing.get("structured") or {}
    provider_state = status.get("condition") or status.get("state", "unknown")
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
    lines += ["", "─" * 40]
    lines += (briefing.get("document") or "").splitlines()
    return lines


# -- the terminal driver ---------------------------------------------------------------------------------------

def run_tui(harnesses: Sequence[HarnessEntry], url: str, token: str, *, refresh_seconds: float = 5.0) -> None:
    """Draw `TuiState` with urwid on its trio event loop; loads go over the operator RPC at `url`."""
    import trio
    import urwid

    from .rpc.client import connect_rpc
    from .rpc.frames import RpcError

    service = "harness.v1.MemoryService"
    state = TuiState(harnesses)
    palette = [("header", "black", "light gray"), ("help", "black", "light gray"), ("title", "bold", ""),
               ("selected", "standout", "")]

    class Keys(urwid.WidgetWrap[urwid.Columns]):
        """The main view: takes focus so every key reaches `on_key`, handles none itself."""

        def selectable(self) -> bool:
            return True

        def keypress(self, size: Any, key: str) -> str | None:
            return key

    def box(title: str, lines: list[str], highlight: int | None = None) -> Any:
        items = [urwid.AttrMap(urwid.Text(line, wrap="ellipsis"), "selected" if i == highlight else None)
                 for i, line in enumerate(lines)]
        return urwid.LineBox(urwid.ListBox(urwid.SimpleFocusListWalker(items)), title=title, title_align="left")

    def main_view() -> Any:
        selected = state.selected if state.harnesses else None
        columns = urwid.Columns([(30, box("Harnesses", state.harness_lines(), selected)),
                                 box("Recent episodes", state.episode_lines())])
        return urwid.Frame(Keys(columns), header=urwid.AttrMap(urwid.Text(state.header(), wrap="ellipsis"), "header"),
                           footer=urwid.AttrMap(urwid.Text(state.help_line()), "help"))

    def overlay_view(base: Any) -> Any:
        body = urwid.Pile([urwid.Text(line) for line in state.overlay_lines()])  # Text wraps to the width
        scroller = urwid.ScrollBar(urwid.Scrollable(body))
        title = "Briefing preview" if state.error is None else "Error"
        framed = urwid.LineBox(scroller, title=title, title_align="left")
        # The base's last row (the help line) stays visible below the overlay.
        return urwid.Overlay(framed, base, align="center", width=("relative", 100), valign="top",
                             height=("relative", 94), min_width=20, min_height=5)

    async def main() -> None:
        event_loop = urwid.TrioEventLoop()

        def redraw() -> None:
            view = main_view()
            loop.widget = overlay_view(view) if state.in_overlay else view
            loop.draw_screen()

        async with trio.open_nursery() as nursery:
            client: Any = None

            async def rpc(method: str, params: dict[str, Any]) -> Any:
                nonlocal client
                if client is None:
                    raise RpcError("UNAVAILABLE", "not connected")
                return await client.call(f"{service}/{method}", params)

            async def refresh() -> None:
                try:
                    status = await rpc("Status", {})
                    listing = await rpc("ListEpisodes", {"limit": RECENT})
                    state.refreshed(status, listing)
                except RpcError as exc:
                    state.unreachable(exc.message)
                redraw()

            async def brief(harness: str) -> None:
                try:
                    briefing = await rpc("GetBriefing", {"harness": harness})
                    status = await rpc("Status", {})
                    state.loaded(briefing, status)
                except RpcError as exc:
                    state.failed(exc.message)
                redraw()

            def on_key(key: str | tuple[str, int, int, int]) -> bool:
                if not isinstance(key, str):
                    return False
                action = state.key(key)
                if state.quit:
                    raise urwid.ExitMainLoop()
                if action is not None and action.harness:
                    nursery.start_soon(brief, action.harness)
                elif action is not None:
                    nursery.start_soon(refresh)
                redraw()
                return True

            async def connection() -> None:
                nonlocal client
                while True:
                    try:
                        async with connect_rpc(url, token) as c:
                            client = c
                            while True:
                                await refresh()
                                await trio.sleep(refresh_seconds)
                    except RpcError as exc:
                        client = None
                        state.unreachable(exc.message)
                        redraw()
                    await trio.sleep(refresh_seconds)

            # Made here, once `on_key` can start loads in the nursery; nothing draws before it exists.
            loop = urwid.MainLoop(main_view(), palette, event_loop=event_loop, handle_mouse=False,
                                  unhandled_input=on_key)
            nursery.start_soon(connection)
            with loop.start():
                await event_loop.run_async()
            nursery.cancel_scope.cancel()

    trio.run(main)
