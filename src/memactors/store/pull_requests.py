"""Pull-request links: which pull request a (repository, branch) last pointed at, for the run
history and briefings (docs/contracts.md, "Run graph")."""

from __future__ import annotations

from datetime import datetime

from ..errors import InvalidArgument
from . import Db
from ._feeds import at_text, clean, clean_opt


def link_pull_request(db: Db, *, repo: str, branch: str, url: str, now: datetime) -> None:
    """Link a pull request to (repo, branch); linking it again moves its linked_at to now."""
    for field, value in (("repo", repo), ("branch", branch), ("url", url)):
        if not value:
            raise InvalidArgument(f"{field} is required", field=field)
    repo, branch, url = clean(repo), clean(branch), clean(url)
    db.execute(
        "INSERT INTO pull_requests (repo, branch, url, linked_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (repo, branch, url) DO UPDATE SET linked_at = excluded.linked_at",
        [repo, branch, url, at_text(now)],
    )


def pull_request_for(db: Db, repo: str, branch: str | None) -> str | None:
    """The most recently linked pull request url for (repo, branch), or None."""
    repo, branch = clean(repo), clean_opt(branch)
    row = db.execute(
        "SELECT url FROM pull_requests WHERE repo = ? AND branch IS NOT DISTINCT FROM ? ORDER BY linked_at DESC, url DESC LIMIT 1",
        [repo, branch],
    ).fetchone()
    return None if row is None else str(row[0])
