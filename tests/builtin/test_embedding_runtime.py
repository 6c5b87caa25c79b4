"""The embedded model's runtime: all-MiniLM-L6-v2 run by onnxruntime gives the vectors the
numpy forward pass it replaced gave, whether a text is embedded alone or in a batch of others, on one
thread, with its weights read from the installed safetensors file rather than copied into the graph.

`tests/data/minilm_reference.json` holds the vectors of that numpy forward pass (embedding.py at
827a142: GELU in its tanh form, within 1e-3 of BERT's erf form that the graph uses), six texts from one
word to past the 128-piece window.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memactors import embedding
from memactors.embedding import DIM, MAX_BATCH, MAX_TOKENS, PAD_SLACK, batches, model_dir, shared_model

pytestmark = pytest.mark.req11

REFERENCE = json.loads((Path(__file__).resolve().parents[1] / "data" / "minilm_reference.json").read_text(encoding="utf-8"))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_onnxruntime_gives_the_numpy_forward_pass_vectors_alone_and_in_one_batch() -> None:
    """The float graph gives the reference vectors (cosine ≥ 0.999); the int8 graph the model runs
    (`onnx_graph`'s default) stays close to them (cosine ≥ 0.975; 0.983–0.995 measured), alone or
    padded in a batch."""
    model = shared_model()
    texts, expected = REFERENCE["texts"], REFERENCE["vectors"]
    assert max(len(model.tokenizer.encode(t).ids) for t in texts) == MAX_TOKENS  # one text is cut
    path = model_dir()
    assert path is not None
    floats = embedding._Model(path, int8=False)
    together = model.encode(texts)  # padded batches of several lengths
    for text, want, batched in zip(texts, expected, together, strict=True):
        [alone] = model.encode([text])
        [exact] = floats.encode([text])
        assert len(alone) == DIM and abs(math.sqrt(sum(x * x for x in alone)) - 1) < 1e-5
        assert cosine(exact, want) >= 0.999, text
        assert 0.975 <= cosine(alone, want) < 0.99999, text  # int8: close, and not the float graph
        assert cosine(batched, alone) >= 0.99999, text  # a text's vector never depends on its batch-mates
    # the six texts are different: a runtime answering one vector for all would fail above, and here
    assert max(cosine(together[0], v) for v in together[2:]) < 0.9


def test_the_model_runs_on_the_usable_cores_and_the_weights_stay_in_their_file() -> None:
    model = shared_model()
    cores = min(len(os.sched_getaffinity(0)), embedding.MAX_THREADS)
    assert model.session.get_session_options().intra_op_num_threads == cores == model.threads
    tasks = len(os.listdir("/proc/self/task"))
    model.encode(["a sentence to embed"] * (3 * MAX_BATCH))
    assert len(os.listdir("/proc/self/task")) == tasks  # no pool started by a batch (runtime or tokenizer)
    path = model_dir()
    assert path is not None
    weights = (path / embedding.WEIGHTS).stat().st_size
    assert len(embedding.onnx_graph(path, int8=False)) < 100_000 < weights  # external data, not copied
    assert len(embedding.onnx_graph(path)) < weights / 6  # only the int8 linear layers are inline
    info = embedding.model_info()
    assert info["loaded"] and info["runtime"].startswith("onnxruntime ") and info["threads"] == cores
    assert info["weights_mb"] > 50 and info["load_rss_mb"] >= 0


def test_a_vector_is_the_same_on_one_thread_as_on_several() -> None:
    """The runtime's threads make a back-fill faster, never its vectors different (a vector
    stored before the change and one computed after must be one vector, bit for bit)."""
    path = model_dir()
    assert path is not None
    texts = ["Fix the ledger rounding for refunds in cents (#42)", "Bump docker/setup-buildx-action from 4.2.0",
             "avoid quadratic child rescan in normalize_invisible_parens " * 6]
    one, several = embedding._Model(path, threads=1), embedding._Model(path, threads=3)
    assert several.session.get_session_options().intra_op_num_threads == 3
    assert one.encode(texts) == several.encode(texts)


@given(st.lists(st.integers(min_value=1, max_value=MAX_TOKENS), max_size=40))
def test_batches_hold_each_text_once_of_similar_lengths(lengths: list[int]) -> None:
    out = batches(lengths)
    assert sorted(i for batch in out for i in batch) == list(range(len(lengths)))
    for batch in out:
        assert 1 <= len(batch) <= MAX_BATCH
        padded = len(batch) * max(lengths[i] for i in batch)
        assert len(batch) == 1 or padded <= PAD_SLACK * sum(lengths[i] for i in batch)


def test_the_int8_weights_fit_every_x86_64_cpus_integer_kernels() -> None:
    """The int8 weights are 7-bit (±WEIGHT_LEVELS = 63): a CPU without AVX-512 VNNI adds pairs of
    u8 activation × s8 weight products in 16 bits, and 2 × 255 × 63 fits where 2 × 255 × 127 saturates,
    so the vectors are the same on every x86-64 CPU (this one's kernels included)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    path = model_dir()
    assert path is not None
    graph = onnx.load_from_string(embedding.onnx_graph(path)).graph
    weights = [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(weights) >= 36  # every linear layer's weights, and their zero points
    assert max(int(np.abs(w).max()) for w in weights) == embedding.WEIGHT_LEVELS
    assert 2 * 255 * embedding.WEIGHT_LEVELS <= 2 ** 15 - 1
    assert {n.op_type for n in graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger"}
