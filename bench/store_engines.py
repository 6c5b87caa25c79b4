"""The store on PostgreSQL against SQLite, side by side in one run.

    .venv/bin/python bench/store_engines.py                       # 10k and 100k episodes, 200 recalls each
    .venv/bin/python bench/store_engines.py --sizes 10000 --queries 100 --json
    .venv/bin/python bench/store_engines.py --ingest-only --ingest 3000    # the ingest rate on each engine alone

What it measures, on one machine (printed), with a throwaway PostgreSQL cluster from
`memactors.testing.postgres` (fsync on, `synchronous_commit = off`: the durability of SQLite's WAL with
`synchronous = NORMAL`, which the SQLite engine uses):

* **recall through the gateway** (p50 / p99): `memactors serve` as a process on the store, an MCP client
  over streamable HTTP with a run token per repository, REQ-12's `recall` tool; and the raw anchor, the
  built-in provider's own text query alone: on PostgreSQL the same `tsvector` query in `psql` (its
  `\\timing`, per query), on SQLite the FTS5 query through sqlean. At 10k and 100k episodes, built by
  bulk-loading synthetic episodes through the store's own writes (the record pipeline would take hours
  at 100k).
* **ingest rate**: `IngestRuns` of 500 records at a time over the RPC into a fresh store, episodes/s
  (each recorded to the built-in provider before the call answers, or queued).
* **fleet**: one PostgreSQL store, 2 daemons × 4 clients against 1 daemon × 8 clients, each client
  sending `IngestRun` one record at a time: records/s in all.

The target: recall on PostgreSQL within 2× of SQLite at 100k; ingest ≥ 300 episodes/s
batched per daemon. docs/benchmarks.md ("Store engines") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp
import trio
from mcp.client.streamable_http import streamable_http_client

from memactors import builtin
from memactors.builtin import index_pg as _builtin_pg
from memactors.episode import episode_id_for
from memactors.repo import scope_for
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.store.engines import open_store
from memactors.store.run_history import record_json
from memactors.testing.postgres import Cluster

SERVICE = "harness.v1.MemoryService"
REPOS = 50
VOCABULARY = 3000
BATCH = 1000
LIMIT = 8


def vocabulary(rng: random.Random) -> list[str]:
    syllables = ["ba", "ko", "ri", "len", "dar", "mo", "te", "sul", "gri", "pha", "ne", "vo", "xi", "qua", "ty"]
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    out = sorted(words)
    rng.shuffle(out)
    return out


def zipf(rng: random.Random, words: list[str]) -> str:
    return words[min(int(rng.paretovariate(1.1)) - 1, len(words) - 1)]


def repo(z: int) -> str:
    return f"forge.example/bench/r{z:02d}"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values) * 1000, 3), "p99_ms": round(pct(values, 99) * 1000, 3),
            "n": len(values)}


# -- the corpus ------------------------------------------------------------------------------------------

def corpus(n: int, seed: int = 7) -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    rng = random.Random(seed)
    words = vocabulary(rng)
    samples: dict[int, list[str]] = {z: [] for z in range(REPOS)}
    out = []
    for i in range(n):
        z = rng.randrange(REPOS)
        harness, run_id = f"h{z:02d}", f"r{i}"
        started = f"2026-10-{1 + i % 28:02d}T{i % 24:02d}:00:{i % 60:02d}Z"
        body = " ".join(zipf(rng, words) for _ in range(rng.randint(40, 120)))
        files = [f"src/{rng.choice(words[:200])}.py" for _ in range(rng.randint(1, 4))]
        if len(samples[z]) < 20:
            samples[z].append(body)
        out.append({"z": z, "harness": harness, "run_id": run_id, "started": started, "body": body, "files": files,
                    "outcome": rng.choice(("succeeded", "succeeded", "failed"))})
    return out, samples


def _write_batch(db: Any, items: list[dict[str, Any]], engine: str) -> int:
    now = "2026-11-30T00:00:00.000000Z"
    for it in items:
        z, harness, run_id, started = it["z"], it["harness"], it["run_id"], it["started"]
        eid = episode_id_for(harness, run_id, started)
        scope = scope_for(repo(z))
        episode = {"episode_id": eid, "harness": harness, "adapter": "claude-code", "run_id": run_id,
                   "trace_id": f"t{run_id}", "model": "bench-model", "repo": repo(z), "branch": "main",
                   "outcome": it["outcome"], "reason": "completed", "started_at": started, "duration_ms": 60000,
                   "cost_usd": None, "cost_source": "unknown", "files_touched": it["files"], "pull_request": None,
                   "verify_failures": [], "result_excerpt": it["body"], "summary": None, "trust_class": "standard",
                   "scope": scope}
        text = "".join(f"{k}: {', '.join(v) if isinstance(v, list) else (v or '')}\n" for k, v in episode.items())
        (record_id,) = db.execute("INSERT INTO run_records (record) VALUES (?) RETURNING id",
                                  [record_json({"harness": harness, "run_id": run_id})]).fetchone()
        db.execute("INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
                   " repo, branch, record_id, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                   [harness, run_id, "claude-code", started, started, it["outcome"], "completed", 60000, repo(z),
                    "main", record_id, now])
        (body_id,) = db.execute("INSERT INTO episode_bodies (body) VALUES (?) RETURNING id",
                                [json.dumps(episode, ensure_ascii=False)]).fetchone()
        db.execute("INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
                   " started_at, recorded_at, body_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   [eid, harness, run_id, repo(z), "main", scope, "standard", it["outcome"], started, now, body_id])
        db.execute("INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at)"
                   " VALUES ('builtin', ?, ?, ?, ?)", [eid, eid, scope, now])
        if engine == "postgresql":
            fields = builtin.doc_fields(text, episode)
            _builtin_pg.write_doc(db, episode_id=eid, scope=scope, fields=fields, started_at=started,
                                  digest=builtin.content_hash(text, ""))
        else:
            builtin.write_doc(db, episode_id=eid, scope=scope, text=text, summary="", files=it["files"],
                              started_at=started, episode=episode)
    return len(items)


async def build(target: Path | str, items: list[dict[str, Any]]) -> float:
    t = time.perf_counter()
    store = await open_store(target)
    try:
        for start in range(0, len(items), BATCH):
            chunk = items[start:start + BATCH]
            await store.write(lambda db, chunk=chunk: _write_batch(db, chunk, store.engine))
    finally:
        store.close()
    return time.perf_counter() - t


def queries(samples: dict[int, list[str]], count: int, seed: int = 11) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        z = rng.randrange(REPOS)
        text = rng.choice(samples[z]).split()
        start = rng.randrange(max(len(text) - 3, 1))
        out.append((z, " ".join(text[start:start + rng.choice((2, 3))])))
    return out


# -- the daemon -----------------------------------------------------------------------------------------

def config_for(root: Path, state: Path, url: str | None, extra: str = "") -> Path:
    path = root / f"harness-{state.name}.toml"
    store_url = f'url = "{url}"\n' if url else ""
    path.write_text(f'[store]\npath = "{state}"\n{store_url}[operator]\nlisten = "127.0.0.1:0"\n'
                    '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                    '[memory.episodes]\nsummary = false\n' + extra, encoding="utf-8")
    return path


@asynccontextmanager
async def daemon(root: Path, config: Path, state: Path) -> AsyncIterator[dict[str, Any]]:
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root), "MEMACTORS_LOG_LEVEL": "WARNING"}
    state.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 -- a bench, before anything runs
    (state / "daemon.json").unlink(missing_ok=True)
    log = (root / f"daemon-{state.name}.log").open("ab")
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                                            stdout=log, stderr=log)
    try:
        with trio.fail_after(120):
            while not (state / "daemon.json").exists():  # noqa: ASYNC110 -- a bench, polling the file
                if proc.poll() is not None:
                    raise SystemExit(f"daemon exited; see {root}/daemon-{state.name}.log")
                await trio.sleep(0.05)
        info = json.loads((state / "daemon.json").read_text())
        info["control"] = read_token(state, "control")
        async with connect_rpc(info["operator"], info["control"]) as rpc:
            with trio.fail_after(60):
                while (await rpc.call(f"{SERVICE}/Status", {}))["state"] != "ready":  # noqa: ASYNC110 -- a bench polling
                    await trio.sleep(0.05)
        yield info
    finally:
        proc.send_signal(2)
        with trio.move_on_after(30):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()


@asynccontextmanager
async def gateway_client(url: str, token: str) -> AsyncIterator[mcp.Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=None) as http, \
            mcp.Client(streamable_http_client(url, http_client=http)) as client:
        yield client


# -- the anchors ------------------------------------------------------------------------------------------

def pg_anchor(cluster: Cluster, dbname: str, qs: list[tuple[int, str]]) -> list[float]:
    """The provider's text query (AND of the words, scope inside) in psql, one `\\timing` figure each."""
    lines = ["\\timing on", "\\o /dev/null"]
    for z, q in qs:
        expression = _builtin_pg.tsquery(builtin.search_words(q), "&")
        lines.append(
            "SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d, to_tsquery('english', "
            f"'{expression}') q WHERE d.scope = ANY(ARRAY['{scope_for(repo(z))}']) AND d.tsv @@ q"
            f" ORDER BY ts_rank_cd('{_builtin_pg.RANK_WEIGHTS}', d.tsv, q, 1) DESC, d.started_at DESC,"
            f" d.episode_id LIMIT {LIMIT};")
    psql = cluster.bindir / "psql"
    cmd = [str(psql), "-X", "-q", "-h", str(cluster.sockets), "-p", str(cluster.port), "-U", "postgres", "-d", dbname]
    out = subprocess.run(cmd, input="\n".join(lines), capture_output=True, text=True, check=True)
    return [float(m) / 1000 for m in re.findall(r"Time: ([0-9.]+) ms", out.stdout + out.stderr)]


def sqlite_anchor(path: Path, qs: list[tuple[int, str]]) -> list[float]:
    """The provider's FTS5 query (the AND of the words, in the scope's doc-id range), through sqlean."""
    from memactors.store.sqlite import _connect

    db = _connect(path)
    times = []
    try:
        for z, q in qs:
            words = builtin.search_words(q)
            t = time.perf_counter()
            db.execute("BEGIN")
            builtin.bm25_candidates(db, words, [scope_for(repo(z))], LIMIT, LIMIT)
            db.execute("COMMIT")
            times.append(time.perf_counter() - t)
    finally:
        db.conn.close()
    return times


# -- the measurements -------------------------------------------------------------------------------------

async def measure_recall(root: Path, engine: str, size: int, n_queries: int, cluster: Cluster) -> dict[str, Any]:
    items, samples = corpus(size)
    state = root / f"{engine}-{size}"
    url = cluster.create_database(f"recall_{size}") if engine == "postgresql" else None
    target: Path | str = url or state / "memactors.db"
    state.mkdir(parents=True, exist_ok=True)
    build_s = await build(target, items)
    if url:
        # What autovacuum does to a table that was just bulk-loaded (hint bits, visibility map,
        # statistics), done now so the first measured recalls do not pay for it.
        await trio.to_thread.run_sync(cluster.admin, "VACUUM ANALYZE", f"recall_{size}")
    qs = queries(samples, n_queries)
    out: dict[str, Any] = {"engine": engine, "episodes": size, "build_s": round(build_s, 1)}
    async with daemon(root, config_for(root, state, url), state) as d, AsyncExitStack() as stack:
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        tokens = {}
        for z in range(REPOS):
            await control.call(f"{SERVICE}/ReportPresence", {
                "harness": f"h{z:02d}", "run_id": f"live{z}", "session_id": "s", "repo": repo(z), "branch": "main",
                "ttl_seconds": 86400})
            tokens[z] = (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}",
                                                                         "run_id": f"live{z}"}))["token"]
        clients: dict[int, mcp.Client] = {}

        async def client_for(z: int) -> mcp.Client:
            if z not in clients:
                clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
            return clients[z]

        for z, _ in qs[:20]:
            await (await client_for(z)).call_tool("recall", {"query": "warm up", "limit": LIMIT})
        times, found = [], 0
        for z, q in qs:
            client = await client_for(z)
            t = time.perf_counter()
            res = await client.call_tool("recall", {"query": q, "limit": LIMIT})
            times.append(time.perf_counter() - t)
            found += "episode ·" in "".join(getattr(c, "text", "") for c in res.content)
    out["gateway"] = summary(times)
    out["queries_with_episodes"] = found
    anchor = (await trio.to_thread.run_sync(pg_anchor, cluster, f"recall_{size}", qs) if engine == "postgresql"
              else await trio.to_thread.run_sync(sqlite_anchor, state / "memactors.db", qs))
    out["anchor"] = summary(anchor)
    out["anchor_kind"] = "psql \\timing, tsvector AND query" if engine == "postgresql" else "sqlean, FTS5 AND query"
    return out


def record(i: int, rng: random.Random, words: list[str], prefix: str = "i") -> dict[str, Any]:
    z = i % REPOS
    body = " ".join(zipf(rng, words) for _ in range(rng.randint(40, 120)))
    return {"harness": f"h{z:02d}", "adapter": "claude-code", "run_id": f"{prefix}{i}", "trace_id": f"t{i}",
            "started_at": "2026-11-28T09:00:00Z", "ended_at": "2026-11-28T09:10:00Z", "duration_ms": 600000,
            "outcome": "succeeded", "reason": "completed", "result_text": body, "spawned_process": True,
            "sessions": [{"session_id": "s1", "cwd": f"/srv/r{z}", "repo": repo(z), "git_branch": "main"}],
            "events": []}


async def measure_ingest(root: Path, engine: str, n: int, cluster: Cluster) -> dict[str, Any]:
    rng, words = random.Random(5), vocabulary(random.Random(7))
    state = root / f"{engine}-ingest"
    url = cluster.create_database("ingest") if engine == "postgresql" else None
    records = [record(i, rng, words) for i in range(n)]
    async with daemon(root, config_for(root, state, url), state) as d, \
            connect_rpc(d["operator"], d["control"]) as rpc:
        outcomes: dict[str, int] = {}
        t = time.perf_counter()
        for start in range(0, n, 500):
            chunk = [{"record": r, "source": f"r{start + k}"} for k, r in enumerate(records[start:start + 500])]
            res = await rpc.call(f"{SERVICE}/IngestRuns", {"records": chunk})
            for item in res["results"]:
                outcomes[item["outcome"]] = outcomes.get(item["outcome"], 0) + 1
        elapsed = time.perf_counter() - t
    return {"engine": engine, "episodes": n, "per_s": round(n / elapsed, 1), "outcomes": outcomes}


async def measure_fleet(root: Path, n: int, cluster: Cluster) -> dict[str, Any]:
    """Records/s from 8 clients sending IngestRun one record at a time: to one daemon, or 4 to each of two
    daemons on the same PostgreSQL store."""
    words = vocabulary(random.Random(7))
    out: dict[str, Any] = {}
    for label, daemons in (("1_daemon_x_8", 1), ("2_daemons_x_4", 2)):
        url = cluster.create_database(f"fleet_{daemons}")
        rng = random.Random(3)
        records = [record(i, rng, words, prefix=f"f{daemons}-") for i in range(n)]
        async with AsyncExitStack() as stack:
            infos = [await stack.enter_async_context(daemon(root, config_for(root, root / f"fleet{daemons}-{k}", url),
                                                            root / f"fleet{daemons}-{k}")) for k in range(daemons)]
            per_client = [records[c::8] for c in range(8)]

            async def client(mine: list[dict[str, Any]], info: dict[str, Any]) -> None:
                async with connect_rpc(info["operator"], info["control"]) as rpc:
                    for r in mine:
                        await rpc.call(f"{SERVICE}/IngestRun", {"record": r})

            t = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for c in range(8):
                    nursery.start_soon(client, per_client[c], infos[c % daemons])
            out[label] = round(n / (time.perf_counter() - t), 1)
    out["ratio"] = round(out["2_daemons_x_4"] / out["1_daemon_x_8"], 2)
    return out


def machine() -> dict[str, Any]:
    info = {"python": platform.python_version(), "system": platform.platform(), "cpus": os.cpu_count()}
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        info["cpu"] = model
    except (OSError, StopIteration):
        pass
    info["load_1m"] = round(os.getloadavg()[0], 2)
    return info


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine(), "recall": [], "ingest": []}
    # shared_buffers 256MB: PostgreSQL's own cache holds the 100k store's index and documents, as the
    # page cache holds the SQLite file (the packaged default is 128MB; a server for a fleet has more).
    with tempfile.TemporaryDirectory(prefix="memactors-bench-") as tmp, \
            Cluster(durable=True, extra=("shared_buffers = 256MB",
                                         f"synchronous_commit = {args.synchronous_commit}")) as cluster:
        root = Path(tmp)
        result["postgresql"] = cluster.admin("SHOW server_version")[0][0]
        result["synchronous_commit"] = args.synchronous_commit
        print_line(f"PostgreSQL {result['postgresql']}, synchronous_commit = {args.synchronous_commit}")
        for size in [] if args.ingest_only else args.sizes:
            for engine in ("sqlite", "postgresql"):
                r = await measure_recall(root, engine, size, args.queries, cluster)
                result["recall"].append(r)
                print_line(f"recall {engine:10} {size:>7}: gateway p50 {r['gateway']['p50_ms']} ms"
                           f" p99 {r['gateway']['p99_ms']} ms; anchor p50 {r['anchor']['p50_ms']} ms"
                           f" ({r['anchor_kind']}); built in {r['build_s']} s")
        for engine in ("sqlite", "postgresql"):
            r = await measure_ingest(root, engine, args.ingest, cluster)
            result["ingest"].append(r)
            print_line(f"ingest {engine:10}: {r['per_s']} episodes/s (IngestRuns of 500), {r['outcomes']}")
        if args.fleet and not args.ingest_only:
            result["fleet"] = await measure_fleet(root, args.fleet, cluster)
            print_line(f"fleet (PostgreSQL, IngestRun x 8 clients): {result['fleet']}")
    return result


def print_line(text: str) -> None:
    print(text, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ingest", type=int, default=3000)
    parser.add_argument("--fleet", type=int, default=2000, help="records for the fleet comparison (0: skip)")
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="off",
                        help="the server's synchronous_commit: off (default) is the durability of SQLite's WAL with"
                             " synchronous = NORMAL; on is PostgreSQL's own default (every commit flushed)")
    parser.add_argument("--ingest-only", action="store_true", help="only the ingest rate (no recall, no fleet)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print_line(f"machine: {machine()}")
    result = trio.run(main_async, args)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
