"""The store's size under steady traffic with forgetting, without VACUUM.

    .venv/bin/python bench/steady_state.py                       # 12 rounds of 500, a window of 1,000
    .venv/bin/python bench/steady_state.py --rounds 20 --per-round 1000 --window 3000

A real daemon (`memactors serve`, built-in provider) takes rounds of run records over the operator RPC
(`IngestRuns`, bench/user_paths.py's corpus). After each round the episodes that fell out of the window
(the oldest live ones beyond `--window`) are forgotten with the operator RPC `Forget`, as the retention
prune would forget them once they are older than `retention`. After each round it prints the database
file's size (after a WAL checkpoint), live and forgotten episodes, and the bytes the round added.

Once the window is full, every round forgets as many episodes as it records: the freed pages (the
body, the run record's text, the built-in provider's document and its full-text entries) are reused
by the next round's episodes, so what a round still adds is what forgetting keeps for a while — each
forgotten episode's tombstone (episode, run and index rows without their text) and the call log. The
hourly retention prune deletes both one retention period later (tombstones once their forget is over;
the run row stays for the graph, so the run is never recorded again): tested on trio's MockClock in
tests/actors/test_retention.py, not here, where the daemon runs on the real clock. Until then the bytes a
round adds are the tombstones' and the call log's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import sqlean
import trio

sys.path.insert(0, str(Path(__file__).parent))
from user_paths import SERVICE, daemon, machine, run_record, vocabulary, write_config  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402


def file_bytes(db: Path) -> tuple[int, int]:
    """The database file and its WAL, after a checkpoint, and the bytes of its free pages."""
    conn = sqlean.connect(str(db))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*")), free


async def measure(root: Path, rounds: int, per_round: int, window: int) -> list[dict[str, Any]]:
    rng = random.Random(5)
    words = vocabulary(random.Random(7))
    state = root / "state"
    config = write_config(root, state)
    live: list[str] = []
    out: list[dict[str, Any]] = []
    forgotten = 0
    before = 0
    async with daemon(root, config, state) as d, connect_rpc(d["operator"], d["control"]) as rpc:
        for r in range(rounds):
            records = [{"record": run_record(r * per_round + k, rng, words)} for k in range(per_round)]
            for start in range(0, per_round, 500):
                res = await rpc.call(f"{SERVICE}/IngestRuns", {"records": records[start:start + 500]})
                live += [x["episode_id"] for x in res["results"] if x.get("outcome") == "recorded"]
            while len(live) > window:
                await rpc.call(f"{SERVICE}/Forget", {"episode_id": live.pop(0)})
                forgotten += 1
            size, free = file_bytes(state / "memactors.db")
            row = {"round": r + 1, "live": len(live), "forgotten": forgotten, "bytes": size,
                   "free_bytes": free, "added": size - before}
            before = size
            out.append(row)
            print(f"  round {row['round']:>3}: {row['live']:>6,} live, {row['forgotten']:>6,} forgotten,"
                  f" {size / 1e6:8.2f} MB ({free / 1e6:5.2f} MB free pages), +{row['added'] / 1e3:8.1f} KB",
                  flush=True)
    out.append({"tables": tables(state / "memactors.db")})
    return out


def tables(db: Path) -> list[tuple[str, int, int]]:
    """(table or index, bytes of its pages, bytes of its payload), largest first (SQLite's dbstat)."""
    conn = sqlean.connect(str(db))
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 12")]
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--per-round", type=int, default=500)
    parser.add_argument("--window", type=int, default=1000, help="live episodes kept; older ones are forgotten")
    parser.add_argument("--json", action="store_true", help="print the rounds as JSON at the end")
    args = parser.parse_args()
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory(prefix="memactors-steady-") as tmp:
        rows = trio.run(measure, Path(tmp), args.rounds, args.per_round, args.window)
    by_table = rows.pop()["tables"]
    print("  after the last round, the largest tables and indexes (pages / payload):")
    for name, pages, payload in by_table:
        print(f"    {name:<34} {pages / 1e6:7.2f} MB / {payload / 1e6:6.2f} MB")
    full = [r for r in rows if r["forgotten"] >= args.per_round]
    if full:
        per = sum(r["added"] for r in full) / (len(full) * args.per_round)
        print(f"once the window is full: {per:,.0f} B added per episode recorded and one forgotten"
              f" ({len(full)} rounds)")
    print(machine(), flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
