"""Malformed and edge-case operator RPC frames, from a seeded generator.

:func:`frame` draws one text frame from a ``random.Random``: mostly a request for one of the daemon's
real methods (``rpc_methods.operator_methods``) with a random subset of its parameters, each either a
plausible value or an edge one (null, booleans, integers past 64 bits, NaN and Infinity, huge, empty and
control-character strings, lone surrogates, deep nesting, wrong containers), sometimes an unknown
parameter; and some frames broken at the frame level (not JSON, truncated, not an object, odd ids, odd
methods, odd params). The same seed gives the same frames. Used by ``bench/rpc_fuzz.py`` (>= 100,000
frames against the daemon as a process) and by the suite's hypothesis test, whose ``st.randoms`` makes
every draw shrinkable.

The daemon must answer every frame with a reply whose code is not ``INTERNAL``: a client's mistake is
``INVALID_ARGUMENT`` (naming the field), a missing thing ``NOT_FOUND``, and so on.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["EDGE_VALUES", "METHODS", "frame"]

SERVICE = "harness.v1.MemoryService"


def _methods() -> dict[str, tuple[str, ...]]:
    from memactors.rpc.methods import operator_methods
    from memactors.service import MemoryService

    # A service never opened: the table's handlers close over it, but only names and parameters are read.
    unopened = MemoryService.__new__(MemoryService)
    return {m.name: tuple(sorted(m.params or ())) for m in operator_methods(unopened)}


#: Every method and the parameters it takes.
METHODS: dict[str, tuple[str, ...]] = _methods()

_RECORD: dict[str, Any] = {
    "harness": "api-fixer", "adapter": "claude-code", "run_id": "fz-1", "trace_id": "t-1",
    "repo": "forge.example/acme/api", "branch": "main", "started_at": "2026-11-28T09:00:00Z",
    "ended_at": "2026-11-28T09:10:00Z", "outcome": "succeeded", "summary": "fuzzed run",
    "model": "claude-sonnet-4-5", "files": ["a.go"],
}

#: A plausible value for each parameter name (what a correct client sends).
PLAUSIBLE: dict[str, list[Any]] = {
    "harness": ["api-fixer", "coder"], "run_id": ["r1", "fz-1"], "episode_id": ["ep_0ff4f87fb61247377c75"],
    "query": ["flaky ledger", "*"], "limit": [1, 5, 50], "paths": [["a.go"], []],
    "repo": ["forge.example/acme/api", "acme/api"], "since": ["2026-11-01T00:00:00Z", "7d"],
    "after": ["2026-11-01T00:00:00Z", "c1"], "as": ["api-fixer"], "text": ["use the fake clock"],
    "scope": ["fleet", "project:forge.example/acme/api"], "status": ["active"], "confidence": [0.5, 1],
    "id": ["f1"], "url": ["https://forge.example/acme/api/pull/1"], "branch": ["main"],
    "session_id": ["s1"], "ttl_seconds": [60], "stance": ["up", "down"], "fact_id": ["f1"],
    "prompt": ["hello"], "wait_seconds": [0, 0.1], "state": ["running", "succeeded"], "replace": [True],
    "workdir": ["/nonexistent"], "provider": ["builtin"], "source": ["fuzz"],
    "record": [_RECORD], "records": [[_RECORD]],
}

#: Values no parameter should take, each of which must be answered precisely.
EDGE_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400,
    0.5, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"),
    "", " ", "\t", "a", "x" * 64, "x" * 129, "x" * 1025, "y" * 70_000, "\x00", "a\x00b", "\x1b[31m",
    "\ud800", "a\udfffb", "\u202e", "☃", "👩‍💻", "../../etc/passwd", "/", "-1", "1e9", "null", "[]",
    "2026-13-45T99:99:99Z", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "P1D", "-5s", "1e999s",
    "ep_", "ep_" + "0" * 200, "project:", "project:../x", "fleet\n", "http://", "javascript:alert(1)",
    [], {}, [None], [1, "a"], ["a"] * 300, [[[]]], {"a": 1}, {"": None}, {"\ud800": 1},
]


def _deep(depth: int) -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = [doc]
    return doc


def _value(rng: random.Random, name: str) -> Any:
    roll = rng.random()
    if roll < 0.45 and name in PLAUSIBLE:
        value = rng.choice(PLAUSIBLE[name])
        if name in ("record", "records") and rng.random() < 0.6:
            return _mutate_record(rng, value)
        return value
    if roll < 0.9:
        return rng.choice(EDGE_VALUES)
    if roll < 0.95:
        return _deep(rng.choice((10, 40, 63, 70, 200)))
    return {rng.choice(list(PLAUSIBLE)): rng.choice(EDGE_VALUES) for _ in range(rng.randint(1, 4))}


def _mutate_record(rng: random.Random, value: Any) -> Any:
    if isinstance(value, list):
        return [_mutate_record(rng, r) for r in value] + ([rng.choice(EDGE_VALUES)] if rng.random() < 0.3 else [])
    record = dict(value)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(record) + ["extra", "cost", "verify", "tokens", "", "\ud800"])
        if rng.random() < 0.3:
            record.pop(key, None)
        else:
            record[key] = rng.choice(EDGE_VALUES)
    return record


def _params(rng: random.Random, method: str) -> dict[str, Any]:
    takes = METHODS.get(method, ())
    params = {name: _value(rng, name) for name in takes if rng.random() < 0.6}
    if rng.random() < 0.08:
        params[rng.choice(["limt", "", "x" * 300, "\ud800", "params", "__proto__"])] = rng.choice(EDGE_VALUES)
    return params


def _dumps(doc: Any) -> str:
    # NaN/Infinity as the tokens Python's parser (the daemon's) accepts; lone surrogates as \u escapes.
    return json.dumps(doc, allow_nan=True)


def frame(rng: random.Random) -> str:
    """One text frame (see the module's docstring)."""
    names = list(METHODS)
    method = rng.choice(names)
    req_id: Any = rng.randint(1, 2**31)
    roll = rng.random()
    if roll < 0.8:
        return _dumps({"id": req_id, "method": method, "params": _params(rng, method)})
    if roll < 0.84:
        return rng.choice(["", " ", "{", "}", "[", "nul", "{\"id\":1,", "\"just a string\"", "1", "null", "[]",
                           "[{\"id\":1}]", "{\"id\":1,\"method\":\"" + method + "\",\"params\":{\"a\":1}",
                           "\x00", "{'id': 1}", "{\"id\":1,\"method\":\"x\"}garbage", "\ufeff{}"])
    if roll < 0.88:
        req_id = rng.choice([None, True, 1.5, -0.0, [], {}, "", "x" * 129, "a\x00", "\ud800", 2**64, -(2**63) - 1,
                             float("nan"), "id-ok"])
        return _dumps({"id": req_id, "method": method, "params": _params(rng, method)})
    if roll < 0.92:
        wrong: Any = rng.choice([None, 1, "", method.lower(), method + "/", SERVICE + "/", SERVICE + "/Nope",
                                 method.replace("harness.v1", "harness.v2"), "x" * 10_000, "\ud800", ["Status"]])
        return _dumps({"id": req_id, "method": wrong, "params": {}})
    if roll < 0.96:
        params = rng.choice([None, [], [1], "params", 1, True, _deep(70), {"": 1}])
        return _dumps({"id": req_id, "method": method, "params": params})
    # duplicate keys, extra top-level members, a huge params object
    choice = rng.random()
    if choice < 0.33:
        return f'{{"id": {req_id}, "method": "{method}", "params": {{}}, "params": {_dumps(_params(rng, method))}}}'
    if choice < 0.66:
        return _dumps({"id": req_id, "method": method, "params": _params(rng, method), "jsonrpc": "2.0",
                       "extra": rng.choice(EDGE_VALUES)})
    return _dumps({"id": req_id, "method": method, "params": {f"k{i}": i for i in range(2000)}})
