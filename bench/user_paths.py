"""What users hit, timed side by side on one generated corpus.

    .venv/bin/python bench/user_paths.py                  # 1k and 10k episodes, 200 queries each
    .venv/bin/python bench/user_paths.py --full           # adds 100k
    .venv/bin/python bench/user_paths.py --sizes 1000000  # 1M, when asked for
    .venv/bin/python bench/user_paths.py --quick          # 1k and 10k, 100 queries, smaller ingest/drain
    .venv/bin/python bench/user_paths.py --sizes 1000 --queries 50 --skip-ingest   # a quick look

Corpus: Zipf-distributed prose over a 3,000-word vocabulary (40-120 words of result text per episode,
rendered as REQ-5's `name: value` lines), spread uniformly over 50 repositories, one harness per
repository. It is bulk-loaded into a fresh state directory (runs, episodes, memory_index and the
built-in provider's documents, with the provider's own `write_doc`), because the point here is to time
the read paths over a given store, not to wait for the build; ingest is timed separately below.

Then a real daemon is started as a subprocess (`memactors serve`) on that state directory, and for the
same queries (2-3 words taken from an episode of the asking repository, asked in that repository,
limit 8), interleaved query by query, it times:

* **gateway**: the agent path — MCP `tools/call recall` over streamable HTTP with the run's bearer token
  (`mcp.Client`), through the daemon's gateway, choke point and in-process built-in provider;
* **wire**: the same `tools/call recall` POST, byte for byte what `mcp.Client` sends, from a minimal
  keep-alive HTTP/1.1 client (a raw socket): the gateway path without the Python MCP client's own cost;
* **rpc**: the operator RPC `Recall` (websocket) with `repo`;
* **embedded**: `MemoryService.recall` in this process (the library path, same store file);
* **agent**: `MemoryService.agent_recall` in this process with the run's view (what the gateway's
  handler calls: the agent path below the HTTP front, facts and exposure included);
* **anchors**: raw FTS5 in this process on the same words and scope, the floor any path stands on:
  `or+col` (words OR-ed, scope as a joined column filter), `or+tok` (words OR-ed, scope as an indexed
  FTS5 token), `and+tok` (words AND-ed, scope token), `or+range` / `and+range` (the scope's doc-id
  range as a rowid bound, no token). Each is `ORDER BY rank LIMIT 8`.

Plus: 8 concurrent gateway clients against 1 (queries per second; `mcp.Client`, and the raw wire client), ingest over the RPC (IngestRun one
by one, and IngestRuns in batches of 500) into a fresh daemon with the built-in provider, the backlog
drain from the built-in provider served over stdio after an outage (the records are queued while the
upstream's command does not exist; the daemon is then restarted with a working one and the time to an
empty backlog is measured), the daemon's RSS, and bytes per episode on disk after the ingest.

It prints the machine first (CPU count, load average: other work on the machine shows up in every
figure), then medians, p99s and the ratio of each path's median to the best anchor's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp
import sqlean
import trio
from loguru import logger
from mcp.client.streamable_http import streamable_http_client

from memactors.builtin import FTS_COLUMNS, query_words, scoped_match, write_doc
from memactors.config import ConfigHolder, load_config
from memactors.episode import episode_id_for
from memactors.repo import scope_for
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.service import open_memory_service
from memactors.store import scope_range
from memactors.store.engines import open_store
from memactors.store.sqlite import _connect

SERVICE = "harness.v1.MemoryService"
REPOS = 50
VOCABULARY = 3000
BATCH = 5000
LIMIT = 8


# -- corpus ----------------------------------------------------------------------------------------

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


def episode_text(fields: dict[str, Any]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def build_corpus(state: Path, n: int, seed: int = 7) -> dict[int, list[str]]:
    """Bulk-load n episodes; returns a few texts per repository for drawing queries."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    samples: dict[int, list[str]] = {z: [] for z in range(REPOS)}
    state.mkdir(parents=True, exist_ok=True)
    path = state / "memactors.db"

    async def init() -> None:
        (await open_store(path)).close()

    trio.run(init)
    db = _connect(path)
    now = "2026-11-30T00:00:00.000000Z"
    try:
        for start in range(0, n, BATCH):
            db.execute("BEGIN")
            for i in range(start, min(n, start + BATCH)):
                z = rng.randrange(REPOS)
                harness, run_id = f"h{z:02d}", f"r{i}"
                day = 1 + i % 28
                started = f"2026-10-{day:02d}T{i % 24:02d}:00:00Z"
                eid = episode_id_for(harness, run_id, started)
                body = " ".join(zipf(rng, words) for _ in range(rng.randint(40, 120)))
                files = [f"src/{rng.choice(words[:200])}.py" for _ in range(rng.randint(1, 4))]
                outcome = rng.choice(("succeeded", "succeeded", "failed"))
                fields = {"episode_id": eid, "harness": harness, "adapter": "claude-code", "run_id": run_id,
                          "trace_id": f"t{i}", "model": "bench-model", "repo": repo(z), "branch": "main",
                          "outcome": outcome, "reason": "completed", "started_at": started, "duration_ms": 60000,
                          "cost_usd": "", "cost_source": "unknown", "files_touched": ", ".join(files),
                          "pull_request": "", "verify_failures": "", "result_excerpt": body, "summary": "",
                          "trust_class": "standard", "scope": scope_for(repo(z))}
                text = episode_text(fields)
                if len(samples[z]) < 20:
                    samples[z].append(body)
                db.execute(
                    "INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
                    " repo, branch, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    [harness, run_id, "claude-code", started, started, outcome, "completed", 60000, repo(z), "main",
                     now])
                body_id = db.execute("INSERT INTO episode_bodies (body) VALUES (?)", [json.dumps(
                    {**fields, "adapter": "claude-code", "model": "bench-model"}, ensure_ascii=False)]).lastrowid
                db.execute(
                    "INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
                    " started_at, recorded_at, body_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    [eid, harness, run_id, repo(z), "main", scope_for(repo(z)), "standard", outcome, started,
                     now, body_id])
                db.execute(
                    "INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at)"
                    " VALUES ('builtin', ?, ?, ?, ?)", [eid, eid, scope_for(repo(z)), now])
                write_doc(db, episode_id=eid, scope=scope_for(repo(z)), text=text, summary="", files=files,
                          started_at=started)
            db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.conn.close()
    return samples


def make_queries(samples: dict[int, list[str]], count: int, seed: int = 11) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        z = rng.randrange(REPOS)
        text = rng.choice(samples[z]).split()
        start = rng.randrange(max(len(text) - 3, 1))
        out.append((z, " ".join(text[start:start + rng.choice((2, 3))])))
    return out


# -- daemon ----------------------------------------------------------------------------------------

def write_config(root: Path, state: Path, extra: str = "") -> Path:
    path = root / "harness.toml"
    path.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                    '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n' + extra,
                    encoding="utf-8")
    return path


@asynccontextmanager
async def daemon(root: Path, config: Path, state: Path, *, wait_ready: bool = True,
                 src: Path | None = None, profile: Path | None = None) -> AsyncIterator[dict[str, Any]]:
    """A `memactors serve` subprocess on `config`; waits for its provider to be ready unless told not
    to (a daemon whose provider never becomes ready, for the drain measurement). `src`: another tree's
    `src` first on PYTHONPATH (before/after in one run); `profile`: the daemon runs under cProfile,
    its stats written there when it stops."""
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    (state / "daemon.json").unlink(missing_ok=True)
    log = (root / "daemon.log").open("ab")
    # cProfile on the thread's CPU clock: on a loaded machine the wall clock charges a call for the waits
    # for a core (a socket send that wakes the client shows as milliseconds).
    profiler = ["-c", "import cProfile, runpy, sys, time; p = cProfile.Profile(time.thread_time);"
                " sys.argv = ['memactors', 'serve']; p.enable()\ntry: runpy.run_module('memactors.cli', run_name='__main__')"
                f"\nfinally: p.disable(); p.dump_stats({str(profile)!r})"] if profile is not None \
        else ["-m", "memactors.cli", "serve"]
    proc = await trio.lowlevel.open_process([sys.executable, *profiler], env=env, stdout=log, stderr=log)
    try:
        with trio.fail_after(120):
            while not (state / "daemon.json").exists():  # noqa: ASYNC110 -- a bench, polling the file
                if proc.poll() is not None:
                    raise SystemExit(f"daemon exited; see {root / 'daemon.log'}")
                await trio.sleep(0.05)
        info = json.loads((state / "daemon.json").read_text())
        info["proc"] = proc
        info["control"] = read_token(state, "control")
        info["read"] = read_token(state, "read")
        if wait_ready:
            async with connect_rpc(info["operator"], info["control"]) as rpc:
                with trio.fail_after(60):
                    while (await rpc.call(f"{SERVICE}/Status", {}))["state"] != "ready":  # noqa: ASYNC110 -- a bench polling the daemon
                        await trio.sleep(0.05)
        yield info
    finally:
        proc.send_signal(2)
        with trio.move_on_after(20):
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


class WireClient:
    """A minimal keep-alive HTTP/1.1 client that POSTs the exact `tools/call recall` request `mcp.Client`
    sends (protocol 2026-07-28 headers and `_meta`): times the gateway without the MCP client's Python.
    Reconnects when the server closed the idle connection (hypercorn's keep-alive timeout)."""

    META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {}}

    def __init__(self, url: str, token: str) -> None:
        authority = url.split("//", 1)[1].split("/", 1)[0]
        self.host, port = authority.rsplit(":", 1)
        self.port = int(port)
        self.token = token
        self.next_id = 0
        self.stream: trio.SocketStream | None = None
        self.buf = b""

    async def call(self, query: str) -> dict[str, Any]:
        self.next_id += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": {
            "name": "recall", "arguments": {"query": query, "limit": LIMIT}, "_meta": self.META}}).encode()
        request = (f"POST /mcp HTTP/1.1\r\nhost: {self.host}:{self.port}\r\nauthorization: Bearer {self.token}\r\n"
                   "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
                   "mcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: recall\r\n"
                   f"content-length: {len(body)}\r\n\r\n").encode() + body
        for _attempt in range(2):
            if self.stream is None:
                self.stream, self.buf = await trio.open_tcp_stream(self.host, self.port), b""
            try:
                await self.stream.send_all(request)
                return json.loads(await self._response())
            except (trio.BrokenResourceError, EOFError):
                await self.stream.aclose()
                self.stream = None
        raise SystemExit("the gateway closed the connection twice in a row")

    async def _response(self) -> bytes:
        assert self.stream is not None
        while b"\r\n\r\n" not in self.buf:
            self.buf += await self._more()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200" not in status:
            raise SystemExit(f"gateway answered {status!r}")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += await self._more()
        self.buf = rest[length:]
        return rest[:length]

    async def _more(self) -> bytes:
        assert self.stream is not None
        got = await self.stream.receive_some(65536)
        if not got:
            raise EOFError
        return bytes(got)

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


def cpu_s(pid: int) -> float:
    """The process's CPU time so far (user + system, all threads), from /proc; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- timing helpers --------------------------------------------------------------------------------

def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values) * 1000, 3), "p99_ms": round(pct(values, 99) * 1000, 3),
            "n": len(values)}


#: Every FTS column but the scope token, as a column filter (what `scoped_match` searches).
TEXT_COLUMNS = "{" + " ".join(FTS_COLUMNS[1:]) + "}"
ANCHORS = ("or+col", "or+tok", "and+tok", "or+range", "and+range")


def anchor_sql(kind: str, words: list[str], scope: str, num: int) -> tuple[str, list[Any]]:
    terms_or = " OR ".join(f'"{w}"' for w in words)
    if kind.endswith("+range"):
        low, high = scope_range(num)
        op = "OR" if kind.startswith("or") else "AND"
        return ("SELECT rowid FROM builtin_fts WHERE builtin_fts MATCH ? AND rowid BETWEEN ? AND ?"
                " ORDER BY rank LIMIT 8", [f"{TEXT_COLUMNS} : ({f' {op} '.join(chr(34) + w + chr(34) for w in words)})",
                                           low, high])
    if kind == "or+col":
        return ("SELECT d.episode_id FROM builtin_fts JOIN builtin_docs d ON d.doc_id = builtin_fts.rowid"
                " WHERE builtin_fts MATCH ? AND d.scope = ? ORDER BY builtin_fts.rank LIMIT 8",
                [f"{TEXT_COLUMNS} : ({terms_or})", scope])
    op = "OR" if kind == "or+tok" else "AND"
    return ("SELECT rowid FROM builtin_fts WHERE builtin_fts MATCH ? ORDER BY rank LIMIT 8",
            [scoped_match(words, [scope], op)])


# -- the measurements ------------------------------------------------------------------------------

async def measure_recall(root: Path, size: int, n_queries: int) -> dict[str, Any]:
    state = root / f"state-{size}"
    t0 = time.perf_counter()
    samples = await trio.to_thread.run_sync(build_corpus, state, size)
    build_s = time.perf_counter() - t0
    queries = make_queries(samples, n_queries)
    config = write_config(root, state)
    out: dict[str, Any] = {"episodes": size, "build_s": round(build_s, 1)}
    async with daemon(root, config, state) as d, AsyncExitStack() as stack:
        rpc = await stack.enter_async_context(connect_rpc(d["operator"], d["read"]))
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        tokens = {}
        for z in range(REPOS):
            minted = await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"})
            tokens[z] = minted["token"]
            # the run's place: an ingested run of that harness in the repository
        await trio.to_thread.run_sync(_seed_live_runs, state)
        clients: dict[int, mcp.Client] = {}
        wires: dict[int, WireClient] = {}

        async def client_for(z: int) -> mcp.Client:
            if z not in clients:
                clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
            return clients[z]

        def wire_for(z: int) -> WireClient:
            if z not in wires:
                wires[z] = WireClient(d["gateway"], tokens[z])
                stack.push_async_callback(wires[z].aclose)
            return wires[z]

        holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
        embedded = await stack.enter_async_context(open_memory_service(holder))
        raw = _connect(state / "memactors.db")
        stack.callback(raw.conn.close)
        views = {z: await embedded.caller_view(tokens[z]) for z in range(REPOS)}
        times: dict[str, list[float]] = {k: [] for k in ("gateway", "wire", "rpc", "embedded", "agent", *ANCHORS)}
        nums = dict(raw.execute("SELECT scope, num FROM builtin_scopes").fetchall())
        found = {"gateway": 0, "wire": 0, "rpc": 0}
        for z, _ in queries[:10]:  # warm-up: open every client used, touch every path
            await (await client_for(z)).call_tool("recall", {"query": "warm up", "limit": LIMIT})
            await wire_for(z).call("warm up")
        for z, q in queries:
            client = await client_for(z)
            scope = scope_for(repo(z))
            words = query_words(q)
            t = time.perf_counter()
            res = await client.call_tool("recall", {"query": q, "limit": LIMIT})
            times["gateway"].append(time.perf_counter() - t)
            found["gateway"] += "episode ·" in "".join(getattr(c, "text", "") for c in res.content)
            t = time.perf_counter()
            reply = await wire_for(z).call(q)
            times["wire"].append(time.perf_counter() - t)
            found["wire"] += "episode ·" in reply["result"]["content"][0]["text"]
            t = time.perf_counter()
            ans = await rpc.call(f"{SERVICE}/Recall", {"query": q, "repo": repo(z), "limit": LIMIT})
            times["rpc"].append(time.perf_counter() - t)
            found["rpc"] += bool(ans["episodes"])
            t = time.perf_counter()
            await embedded.recall(query=q, repo=repo(z), limit=LIMIT)
            times["embedded"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await embedded.agent_recall(views[z], query=q, limit=LIMIT)
            times["agent"].append(time.perf_counter() - t)
            for kind in ANCHORS:
                sql, params = anchor_sql(kind, words, scope, nums.get(scope, 0))
                t = time.perf_counter()
                raw.execute(sql, params).fetchall()
                times[kind].append(time.perf_counter() - t)
        out["paths"] = {k: summary(v) for k, v in times.items()}
        best = min(ANCHORS, key=lambda k: out["paths"][k]["p50_ms"])
        out["best_anchor"] = best
        for k in ("gateway", "wire", "rpc", "embedded", "agent"):
            out["paths"][k]["x_anchor"] = round(out["paths"][k]["p50_ms"] / max(out["paths"][best]["p50_ms"], 1e-6), 1)
        out["queries_with_episodes"] = found
        out["concurrency"] = await measure_concurrency(client_for, queries)
        out["concurrency_wire"] = await measure_wire_concurrency(d["gateway"], tokens, queries)
        out["daemon_rss_mb"] = round(rss_mb(d["pid"]), 1)
    return out


def _seed_live_runs(state: Path) -> None:
    """Each minted run (h<z>/live<z>) works in its repository: a run row the view resolves from."""
    db = _connect(state / "memactors.db")
    try:
        db.execute("BEGIN")
        for z in range(REPOS):
            db.execute("INSERT OR IGNORE INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason,"
                       " duration_ms, repo, branch, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       [f"h{z:02d}", f"live{z}", "claude-code", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z",
                        "succeeded", "completed", 1, repo(z), "main", "2026-11-30T00:00:00Z"])
        db.execute("COMMIT")
    finally:
        db.conn.close()


async def measure_concurrency(client_for: Callable[[int], Any], queries: list[tuple[int, str]]) -> dict[str, Any]:
    """Queries per second through the gateway: one client alone, then 8 clients at once (same queries)."""
    async def run(clients: int) -> float:
        per = [queries[i::clients] for i in range(clients)]
        t = time.perf_counter()

        async def worker(mine: list[tuple[int, str]]) -> None:
            for z, q in mine:
                await (await client_for(z)).call_tool("recall", {"query": q, "limit": LIMIT})

        async with trio.open_nursery() as nursery:
            for mine in per:
                nursery.start_soon(worker, mine)
        return len(queries) / (time.perf_counter() - t)

    one = await run(1)
    eight = await run(8)
    return {"qps_1": round(one, 1), "qps_8": round(eight, 1), "ratio": round(eight / one, 2)}


async def measure_wire_concurrency(url: str, tokens: dict[int, str],
                                   queries: list[tuple[int, str]]) -> dict[str, Any]:
    """As measure_concurrency, with the raw wire client: the daemon's scaling without 8 MCP clients'
    Python competing for the same 2 cores (each worker opens its own connections)."""
    async def run(clients: int) -> float:
        per = [queries[i::clients] for i in range(clients)]
        conns: list[dict[int, WireClient]] = [{} for _ in range(clients)]

        async def worker(mine: list[tuple[int, str]], own: dict[int, WireClient]) -> None:
            for z, q in mine:
                await own.setdefault(z, WireClient(url, tokens[z])).call(q)

        for mine, own in zip(per, conns, strict=True):  # connect first: time the calls, not the handshakes
            for z, _ in mine:
                if z not in own:
                    own[z] = WireClient(url, tokens[z])
                    await own[z].call("warm up")
        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for mine, own in zip(per, conns, strict=True):
                nursery.start_soon(worker, mine, own)
        elapsed = time.perf_counter() - t
        for own in conns:
            for c in own.values():
                await c.aclose()
        return len(queries) / elapsed

    one = await run(1)
    eight = await run(8)
    return {"qps_1": round(one, 1), "qps_8": round(eight, 1), "ratio": round(eight / one, 2)}


def run_record(i: int, rng: random.Random, words: list[str]) -> dict[str, Any]:
    z = i % REPOS
    body = " ".join(zipf(rng, words) for _ in range(rng.randint(40, 120)))
    return {"harness": f"h{z:02d}", "adapter": "claude-code", "run_id": f"i{i}", "trace_id": f"t{i}",
            "started_at": "2026-11-28T09:00:00Z", "ended_at": "2026-11-28T09:10:00Z", "duration_ms": 600000,
            "outcome": "succeeded", "reason": "completed", "result_text": body, "spawned_process": True,
            "sessions": [{"session_id": "s1", "cwd": f"/srv/r{z}", "repo": repo(z), "git_branch": "main"}],
            "events": []}


def db_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.glob("memactors.db*"))


async def measure_ingest(root: Path, single: int, batch: int) -> dict[str, Any]:
    rng = random.Random(5)
    words = vocabulary(random.Random(7))
    state = root / "state-ingest"
    config = write_config(root, state)
    out: dict[str, Any] = {}
    async with daemon(root, config, state) as d, connect_rpc(d["operator"], d["control"]) as rpc:
        records = [run_record(i, rng, words) for i in range(single + batch)]
        # Daemon CPU per episode (its utime + stime over the phase): load on the machine moves it much
        # less than the wall-clock rates.
        c, t = cpu_s(d["pid"]), time.perf_counter()
        for r in records[:single]:
            await rpc.call(f"{SERVICE}/IngestRun", {"record": r})
        out["single_rpc_per_s"] = round(single / (time.perf_counter() - t), 1)
        out["single_daemon_cpu_ms"] = round(1000 * (cpu_s(d["pid"]) - c) / max(single, 1), 2)
        c, t = cpu_s(d["pid"]), time.perf_counter()
        outcomes: dict[str, int] = {}
        for start in range(single, single + batch, 500):
            chunk = [{"record": r, "source": f"r{start + k}"} for k, r in enumerate(records[start:start + 500])]
            res = await rpc.call(f"{SERVICE}/IngestRuns", {"records": chunk})
            for item in res["results"]:
                outcomes[item["outcome"]] = outcomes.get(item["outcome"], 0) + 1
        out["batch_rpc_per_s"] = round(batch / (time.perf_counter() - t), 1)
        out["batch_daemon_cpu_ms"] = round(1000 * (cpu_s(d["pid"]) - c) / max(batch, 1), 2)
        out["batch_outcomes"] = outcomes
        out["daemon_rss_mb"] = round(rss_mb(d["pid"]), 1)
    n = single + batch
    db = sqlean.connect(str(state / "memactors.db"))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    out["episodes"] = n
    out["bytes_per_episode"] = round(db_bytes(state) / n)
    return out


async def measure_drain(root: Path, n: int) -> dict[str, Any]:
    """Queue n records while the stdio provider's command does not exist, then time the drain."""
    rng = random.Random(9)
    words = vocabulary(random.Random(7))
    state = root / "state-drain"
    upstream_db = root / "upstream.db"
    broken = write_config(root, state, '[memory]\nprovider = "bi"\n[mcp.bi]\ncommand = "/nonexistent/provider"\n')
    out: dict[str, Any] = {"episodes": n}
    # The provider is down for this daemon's life: every record is acknowledged and queued.
    async with daemon(root, broken, state, wait_ready=False) as d, connect_rpc(d["operator"], d["control"]) as rpc:
        for start in range(0, n, 500):
            chunk = [{"record": run_record(10_000_000 + start + k, rng, words)} for k in range(min(500, n - start))]
            await rpc.call(f"{SERVICE}/IngestRuns", {"records": chunk})
        pending = (await rpc.call(f"{SERVICE}/Status", {}))["pending"]["records"]
    out["queued"] = pending
    working = write_config(root, state, '[memory]\nprovider = "bi"\n[mcp.bi]\n'
                           f'command = "{sys.executable}"\n'
                           f'args = ["-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", "{upstream_db}"]\n')
    t = time.perf_counter()
    async with daemon(root, working, state) as d, connect_rpc(d["operator"], d["control"]) as rpc:
        ready = time.perf_counter()
        providers = child_pids(d["pid"])  # the stdio provider (and its spare process)
        cpu_daemon, cpu_providers = cpu_s(d["pid"]), sum(cpu_s(p) for p in providers)
        at_ready = (await rpc.call(f"{SERVICE}/Status", {}))["pending"]["records"]
        with trio.move_on_after(600):
            while (await rpc.call(f"{SERVICE}/Status", {}))["pending"]["records"] > 0:  # noqa: ASYNC110 -- polls the daemon
                await trio.sleep(0.05)
        done = time.perf_counter()
        cpu_daemon, cpu_providers = cpu_s(d["pid"]) - cpu_daemon, sum(cpu_s(p) for p in providers) - cpu_providers
        left = (await rpc.call(f"{SERVICE}/Status", {}))["pending"]["records"]
    out["start_to_ready_s"] = round(ready - t, 2)
    out["drain_s"] = round(done - ready, 2)
    out["left"] = left
    out["pending_at_ready"] = at_ready
    out["drain_per_s"] = round((at_ready - left) / max(done - ready, 1e-6), 1)
    out["drain_daemon_cpu_ms"] = round(1000 * cpu_daemon / max(at_ready - left, 1), 2)
    out["drain_provider_cpu_ms"] = round(1000 * cpu_providers / max(at_ready - left, 1), 2)
    return out


def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs,"
            f" load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, Python {platform.python_version()},"
            f" SQLite {sqlean.sqlite_version}")


def cold_cli(root: Path) -> dict[str, float]:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memactors.cli", "--help"], capture_output=True, check=False,
                   env={**os.environ, "HOME": str(root)})
    return {"help_s": round(time.perf_counter() - t, 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="memactors-bench-", dir=args.tmp))
    report: dict[str, Any] = {"machine": machine(), "recall": []}
    print(report["machine"], flush=True)
    try:
        for size in args.sizes:
            r = await measure_recall(root, size, args.queries)
            report["recall"].append(r)
            print_recall(r)
        if not args.skip_ingest:
            report["ingest"] = await measure_ingest(root, args.single, args.batch)
            print("ingest:", json.dumps(report["ingest"]), flush=True)
            report["drain"] = await measure_drain(root, args.drain)
            print("drain:", json.dumps(report["drain"]), flush=True)
        report["cli"] = cold_cli(root)
        print("cli:", json.dumps(report["cli"]), flush=True)
        report["machine_after"] = machine()
        print(report["machine_after"], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


def print_recall(r: dict[str, Any]) -> None:
    print(f"\n{r['episodes']:,} episodes, {REPOS} repositories (bulk build {r['build_s']} s)")
    print(f"  {'path':<10} {'p50 ms':>8} {'p99 ms':>8} {'x best anchor':>14}")
    for k, v in r["paths"].items():
        print(f"  {k:<10} {v['p50_ms']:>8.2f} {v['p99_ms']:>8.2f} {v.get('x_anchor', ''):>14}")
    print(f"  best anchor: {r['best_anchor']}; queries with episodes: {r['queries_with_episodes']}")
    c = r["concurrency"]
    w = r["concurrency_wire"]
    print(f"  gateway (mcp.Client): 1 client {c['qps_1']} q/s, 8 clients {c['qps_8']} q/s ({c['ratio']}x);"
          f" wire: 1 client {w['qps_1']} q/s, 8 clients {w['qps_8']} q/s ({w['ratio']}x);"
          f" daemon RSS {r['daemon_rss_mb']} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--full", action="store_true", help="add 100k episodes")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--single", type=int, default=300, help="records ingested one by one over the RPC")
    parser.add_argument("--batch", type=int, default=2000, help="records ingested through IngestRuns")
    parser.add_argument("--drain", type=int, default=2000, help="records queued, then drained")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="1k and 10k, 100 queries, 200 single + 1,000 batched ingests, 500 drained (~3 min)")
    args = parser.parse_args()
    if args.quick:
        args.queries, args.single, args.batch, args.drain = 100, 200, 1000, 500
    logger.remove()  # the embedded service's log lines would be timed too (the daemon logs to its file)
    if args.sizes is None:
        args.sizes = [1000, 10000] + ([100000] if args.full else [])
    report = trio.run(main_async, args)
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
