"""The vector back-fill's cost in the daemon's CPU time (target: ≥ 100 episodes per CPU-second).

Imports a real repository's history with `memactors import git` (the CLI, a subprocess) into a fresh
daemon in the default configuration (the embedded model), waits until every record is recorded, then
measures the daemon process's CPU time (user + system, all its threads, from /proc/<pid>/stat) and
the episodes still without a vector, at that moment and when the background embedder has none left:
episodes embedded over daemon CPU-seconds spent meanwhile (what the back-fill costs, the model and
everything around it: the store's reads and writes, the embedding texts, the vector index). Wall time
and the machine's load are printed beside it. With `--sample N`, the vectors of N episodes are
written to a JSON file (`--vectors`), and compared with a file from an earlier build (`--compare`):
the largest difference and the smallest cosine, so a speed change is seen not to change a vector.

    .venv/bin/python bench/backfill_cpu.py /work/.mirror/encode+httpx/repo --repo-key github.com/encode/httpx \\
        [--sample 200 --vectors after.json --compare before.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_quality import cli, machine  # noqa: E402
from user_paths import SERVICE, daemon  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, every thread of it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def sample_vectors(state: Path, n: int) -> dict[str, list[float]]:
    """The stored vectors of the first `n` episodes by id (the SQLite store's builtin_vec)."""
    import sqlean  # the project's sqlite with extension loading
    import sqlite_vec

    db = sqlean.connect(str(state / "memactors.db"))
    db.enable_load_extension(True)
    sqlite_vec.load(db)
    rows = db.execute("SELECT d.episode_id, vec_to_json(v.embedding) FROM builtin_docs d"
                      " JOIN builtin_vec v ON v.doc_id = d.doc_id ORDER BY d.episode_id LIMIT ?", [n]).fetchall()
    return {eid: json.loads(vector) for eid, vector in rows}


def compare(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, Any]:
    common = sorted(set(a) & set(b))
    worst, low = 0.0, 1.0
    for k in common:
        x, y = a[k], b[k]
        worst = max(worst, max(abs(p - q) for p, q in zip(x, y, strict=True)))
        dot = sum(p * q for p, q in zip(x, y, strict=True))
        low = min(low, dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y))))
    return {"compared": len(common), "max_abs_diff": worst, "min_cosine": low}


async def evaluate(repo: str, key: str, root: Path, sample: int) -> dict[str, Any]:
    state = root / "state"
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n', encoding="utf-8")
    out: dict[str, Any] = {"machine_before": machine()}
    async with daemon(root, config, state) as d:
        pid = d["proc"].pid
        t = time.perf_counter()
        done = await trio.to_thread.run_sync(lambda: cli(config, root, "import", "git", "--repo", repo,
                                                         "--repo-key", key, "--json"))
        if done.returncode != 0:
            raise SystemExit(f"import git failed: {done.stderr[-500:]}")
        async with connect_rpc(d["operator"], d["control"]) as control:
            with trio.fail_after(900):
                while (await control.call(f"{SERVICE}/Status", {}))["pending"].get("records"):  # noqa: ASYNC110
                    await trio.sleep(0.2)
            out["ingest_s"] = round(time.perf_counter() - t, 1)
            cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
            emb = (await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}
            pending0 = int(emb.get("pending") or 0)
            with trio.fail_after(3600):
                while True:
                    emb = (await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}
                    if not emb.get("pending") and not emb.get("running"):
                        break
                    await trio.sleep(0.5)
            cpu1, wall1 = cpu_seconds(pid), time.perf_counter()
    out.update(episodes=emb.get("episodes"), backfilled=pending0, cpu_s=round(cpu1 - cpu0, 2),
               wall_s=round(wall1 - wall0, 1), machine_after=machine(),
               per_cpu_s=round(pending0 / (cpu1 - cpu0), 1) if cpu1 > cpu0 else None,
               per_wall_s=round(pending0 / (wall1 - wall0), 1) if wall1 > wall0 else None)
    if sample:
        out["vectors"] = sample_vectors(state, sample)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo")
    p.add_argument("--repo-key", required=True)
    p.add_argument("--sample", type=int, default=0, help="episodes whose vectors are kept")
    p.add_argument("--vectors", help="write the sampled vectors here")
    p.add_argument("--compare", help="a --vectors file of an earlier build to compare with")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="backfill-cpu-") as tmp:
        out = trio.run(evaluate, args.repo, args.repo_key, Path(tmp), args.sample)
    vectors = out.pop("vectors", None)
    print(f"# backfill_cpu: {out['episodes']} episodes; ingest {out['ingest_s']} s; then {out['backfilled']} "
          f"back-filled in {out['cpu_s']} daemon CPU-s ({out['wall_s']} s wall)")
    print(f"episodes per daemon CPU-second: {out['per_cpu_s']}   per wall second: {out['per_wall_s']}")
    print(f"before: {out['machine_before']}\nafter:  {out['machine_after']}")
    if vectors is not None and args.vectors:
        Path(args.vectors).write_text(json.dumps(vectors), encoding="utf-8")
    if vectors is not None and args.compare:
        print("vectors vs", args.compare, compare(json.loads(Path(args.compare).read_text()), vectors))


if __name__ == "__main__":
    main()
