"""Bytes per episode by table and index, at 10k episodes with vectors: how compact the store is.

    .venv/bin/python bench/store_bytes.py                          # 10k episodes
    .venv/bin/python bench/store_bytes.py --size 1000 --keep /tmp/corpora

The corpus is bench/user_paths.py's (as bench/recall_path.py builds it: 50 repositories, Zipf prose, the
episodes in the daemon's tables and in the built-in provider's), every episode given a vector under the
embedded model's key as a back-fill stores it (bench/embed_gateway.py: the vector in `builtin_vec` and
in the content cache). A `memactors serve` then starts on it once (what a restart does to a store: the
vector table is compacted to the current chunk size) and stops. It prints, from SQLite's `dbstat`
virtual table, the pages of every table with its indexes, in bytes per episode, and the file sizes
(database, WAL) beside the total. The machine and its load come first.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_profile import embedded_corpus  # noqa: E402
from user_paths import daemon, machine, write_config  # noqa: E402

from memactors.store.sqlite import _connect  # noqa: E402


async def restart(root: Path, state: Path) -> None:
    async with daemon(root, write_config(root, state), state):
        pass


def table_bytes(path: Path) -> tuple[int, dict[str, int], dict[str, int]]:
    """Episodes, bytes per table (its indexes apart), bytes per table's indexes."""
    db = _connect(path)
    try:
        owner = dict(db.execute("SELECT name, tbl_name FROM sqlite_schema").fetchall())
        episodes = int(db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
        own: dict[str, int] = defaultdict(int)
        idx: dict[str, int] = defaultdict(int)
        kinds = dict(db.execute("SELECT name, type FROM sqlite_schema").fetchall())
        for name, size in db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall():
            table = owner.get(name, name)
            # vec0 and FTS5 keep their data in shadow tables named after the virtual table
            for virtual in ("builtin_vec", "builtin_fts"):
                if table.startswith(virtual + "_"):
                    table = virtual
            (idx if kinds.get(name) == "index" or name.startswith("sqlite_autoindex") else own)[table] += int(size)
        free = int(db.execute("PRAGMA freelist_count").fetchone()[0]) * int(db.execute("PRAGMA page_size").fetchone()[0])
        own["(free pages)"] += free
        return episodes, own, idx
    finally:
        db.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    args = parser.parse_args()
    print(machine(), flush=True)
    with embedded_corpus(args.keep, args.size) as (root, state, _):
        trio.run(restart, root, state)
        path = state / "memactors.db"
        n, own, idx = table_bytes(path)
        rows = sorted(set(own) | set(idx), key=lambda k: -(own.get(k, 0) + idx.get(k, 0)))
        print(f"{n} episodes; bytes per episode (dbstat pages)")
        print(f"    {'table':<28} {'rows':>9} {'indexes':>9} {'total':>9}")
        for k in rows:
            a, b = own.get(k, 0), idx.get(k, 0)
            if a + b >= n:  # at least a byte per episode
                print(f"    {k:<28} {a / n:>9.0f} {b / n:>9.0f} {(a + b) / n:>9.0f}")
        total = sum(own.values()) + sum(idx.values())
        wal = path.with_name(path.name + "-wal")
        print(f"    {'all pages':<28} {'':>9} {'':>9} {total / n:>9.0f}")
        print(f"    database file {path.stat().st_size / n:.0f} B/episode, WAL {wal.stat().st_size if wal.exists() else 0} bytes")
    print(machine(), flush=True)


if __name__ == "__main__":
    main()
