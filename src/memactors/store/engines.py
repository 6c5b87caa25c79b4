"""Which engine a store target opens: `open_store(target)`, the one place that knows both engines.

A path opens (or creates) the SQLite file there (``store.sqlite``); a ``postgresql://`` URL connects to
that database (``store.pg``). A third engine is a module beside those two, a subclass of `Store`, and a
branch here. Kept apart from the interface (``memactors.store``) so that the engines import the
interface and the interface imports no engine.
"""

from __future__ import annotations

from pathlib import Path

from . import Store, is_store_url


async def open_store(target: Path | str, *, daemon_id: str = "local") -> Store:
    """Open the store at `target` (a SQLite path, or a ``postgresql://`` URL) and apply pending
    migrations."""
    if isinstance(target, str) and is_store_url(target):
        from .pg import PgStore

        return await PgStore.connect(target, daemon_id=daemon_id)
    from .sqlite import SqliteStore

    return await SqliteStore.connect(Path(target), daemon_id=daemon_id)
