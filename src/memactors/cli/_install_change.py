"""What `memactors install` / `uninstall` plan: a :class:`Change` to one file, for one :class:`Target`.

The vocabulary the agents' file layouts (``_layout_claude``, ``_layout_codex``, ``_layout_settings``) answer in
and the planning over them (``_install_plan``) shows, records and applies. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Change", "Target"]


@dataclass(frozen=True)
class Change:
    """One file's text before and after (None: absent / to be removed); ``private`` files hold the token
    and are written 0600."""

    path: Path
    before: str | None
    after: str | None
    private: bool
    what: str

    @property
    def action(self) -> str:
        if self.before == self.after:
            return "unchanged"
        if self.after is None:
            return "remove"
        return "create" if self.before is None else "update"


@dataclass(frozen=True)
class Target:
    """Where an agent's configuration lives for one install: a project directory, or the user's."""

    agent: str
    project: Path | None  # None: --user

    @property
    def scope(self) -> str:
        return "user" if self.project is None else "project"
