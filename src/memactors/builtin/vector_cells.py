"""Approximate vector search for a large scope, the same on both store engines: a per-scope inverted
file (IVF). A scope (one repository's episodes) with CELLS_FROM vectors or more is divided into cells
by k-means over its own vectors; every vector is stored with its cell, and a knn reads only the
`probes(cells)` cells whose centroids are nearest the query, instead of every vector of the scope. Below
CELLS_FROM a scope is one cell (0) and its knn is exact.

Why per scope and not one index over the store: every recall is confined to the caller's scopes
(REQ-9), and a store-wide approximate index (pgvector's HNSW or IVFFlat) searched with a scope filter
loses most of its recall on a big scope among many (docs/benchmarks.md, "A million episodes"); a
scope's own cells hold only its own vectors. Why k-means cells and not a graph: the cells are plain
rows (SQLite: the second key of `builtin_vec`'s clustered primary key, the probed cells read in one
aggregate and scored in numpy; PostgreSQL: a column under a b-tree, scored by pgvector), so nothing
needs AVX-512 or a native extension beyond the one each engine already has.

When: the cells are (re)made off the recall path, by the built-in provider's back-fill after each
pass (`divide_scopes`): a scope is divided when it reaches CELLS_FROM vectors and again whenever it
has doubled since (so the cells stay near CELL_ROWS vectors each, and the work of all re-divisions is
at most twice the scope's vectors). A vector written between two divisions joins its nearest cell.
k-means and the assignment run in a worker thread over a read transaction; only the new cells and the
moved vectors are written, in one write transaction, so a recall sees the old cells or the new ones,
never a mix. Measured by bench/scale.py (recall@8 against exact beside the time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

if TYPE_CHECKING:
    import numpy as np

    from ..store import Store

#: A scope with this many vectors or more is divided into cells (below it the knn is exact: sqlite-vec
#: scans 20,000 int8 vectors in ~17 ms of CPU; a smaller scope gains little, as its knn must read about
#: half its cells to keep recall).
CELLS_FROM = 20_000
#: Vectors per cell when a scope is divided (it holds up to twice that before the next division).
CELL_ROWS = 256
#: A knn in a divided scope of `cells` cells reads the PROBE_FACTOR × √cells nearest (`probes`): the
#: vectors read grow with the square root of the scope. Measured on bench/scale.py's corpus (whose derived
#: vectors lie between two real ones, harder for cells than real embeddings): recall@8 against the exact
#: float32 search 0.96 at 17k vectors (32 of 66 cells read) and 0.97 at 170k (96 of 664), where the exact
#: int8 scan itself is 0.99 (docs/benchmarks.md).
PROBE_FACTOR = 4.0
#: k-means: the vectors sampled to fit the centroids (per cell) and the rounds.
SAMPLE_PER_CELL = 48
ROUNDS = 8


@attrs.frozen
class Division:
    """A scope's new cells: each centroid (unit float32 rows) and the cell of each of its vectors."""

    scope: str
    vectors: int
    centroids: Any  # np.ndarray, (cells, dim) float32
    cells: dict[int, int]  # doc_id -> cell


class CellIndex(Protocol):
    """What `divide_scopes` asks of a store engine's index (`index_sqlite`, `index_pg`)."""

    def scopes_to_divide(self, db: Any) -> list[str]:
        """The scopes with CELLS_FROM vectors or more that have no cells yet or have doubled since."""
        ...

    def scope_vectors(self, db: Any, scope: str) -> tuple[list[int], Any]:
        """The scope's doc ids and their vectors (an (n, dim) float32 array of unit rows)."""
        ...

    def write_division(self, db: Any, division: Division) -> None:
        """Store the scope's new cells and move its vectors into them (one transaction)."""
        ...

    async def pack_scopes(self, store: Store) -> int:
        """After a pass: lay out again the cells whose vectors were written since (0 where the table
        already keeps a cell's vectors together); returns the vectors laid out."""
        ...


def probes(cells: int) -> int:
    """How many of a divided scope's `cells` a knn reads (all of them in a scope of few cells)."""
    return min(cells, math.ceil(PROBE_FACTOR * math.sqrt(cells)))


def due(vectors: int, divided_at: int | None) -> bool:
    """Whether a scope of `vectors` vectors, divided when it had `divided_at` (None: never), is (re)divided."""
    if vectors < CELLS_FROM:
        return False
    return divided_at is None or vectors >= 2 * divided_at


def unit_rows(x: np.ndarray) -> np.ndarray:
    import numpy as np

    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: np.ndarray = (x / norms).astype(np.float32)
    return out


#: Rows a knn converts to float32 and scores at a time: a slice stays in the CPU's cache (40k vectors
#: in one piece cost 13 ms here, in slices of 2,048 9 ms).
SCORE_ROWS = 2048


def nearest(x: np.ndarray, vector: Sequence[float], k: int,
            as_float32: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the `k` rows of `x` closest to `vector` by cosine (unordered) and every row's
    cosine distance: exact, in numpy, SCORE_ROWS rows at a time, each slice turned into float32 by
    `as_float32` (default: `astype`) — the knn of both engines' cells."""
    import numpy as np

    q = np.asarray(vector, dtype=np.float32)
    q = q / max(float(np.linalg.norm(q)), 1e-12)
    similarity = np.empty(len(x), dtype=np.float32)
    for start in range(0, len(x), SCORE_ROWS):
        piece = x[start:start + SCORE_ROWS]
        rows = piece.astype(np.float32) if as_float32 is None else as_float32(piece)
        # einsum, not `@`: one thread, where BLAS's threads would spin on the other core after each query
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        norms[norms == 0] = 1.0
        similarity[start:start + SCORE_ROWS] = np.einsum("ij,j->i", rows, q) / norms
    distance = 1.0 - similarity
    best = np.argpartition(distance, k)[:k] if len(distance) > k else np.arange(len(distance))
    return best, distance


def kmeans(x: np.ndarray, cells: int, *, seed: int = 0) -> np.ndarray:
    """Spherical k-means: `cells` unit centroids fitted on a sample of the unit rows `x`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sample = x[rng.choice(len(x), size=min(len(x), SAMPLE_PER_CELL * cells), replace=False)]
    centroids = sample[rng.choice(len(sample), size=cells, replace=False)].copy()
    for _ in range(ROUNDS):
        nearest = np.argmax(sample @ centroids.T, axis=1)
        order = np.argsort(nearest, kind="stable")
        members, starts = np.unique(nearest[order], return_index=True)
        sums = np.add.reduceat(sample[order], starts, axis=0)
        centroids[members] = unit_rows(sums)  # an empty cell keeps its old centroid
    return centroids


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each row's nearest centroid (cosine), in slices so the scores stay small."""
    import numpy as np

    return np.concatenate([np.argmax(x[i:i + 16_384] @ centroids.T, axis=1) for i in range(0, len(x), 16_384)]
                          or [np.zeros(0, dtype=np.int64)])


def divide(scope: str, doc_ids: Sequence[int], x: np.ndarray) -> Division:
    """The scope's cells: k-means with one cell per CELL_ROWS vectors, every vector assigned."""
    cells = max(1, len(doc_ids) // CELL_ROWS)
    centroids = kmeans(x, cells)
    nearest = assign(x, centroids)
    return Division(scope, len(doc_ids), centroids, {int(d): int(c) for d, c in zip(doc_ids, nearest, strict=True)})


async def divide_scopes(store: Store, index: CellIndex) -> int:
    """(Re)divide every scope that is due (`due`), one at a time: read its vectors, fit its cells in a
    worker thread, write them. Returns the scopes divided."""
    scopes: list[str] = await store.read(index.scopes_to_divide)
    for scope in scopes:

        def read(db: Any, scope: str = scope) -> tuple[list[int], Any]:
            return index.scope_vectors(db, scope)

        doc_ids, x = await store.read(read)
        if not doc_ids:
            continue
        division = await trio.to_thread.run_sync(divide, scope, doc_ids, x)

        def write(db: Any, division: Division = division) -> None:
            index.write_division(db, division)

        await store.write(write)
    await index.pack_scopes(store)  # PostgreSQL packs a cell's vectors in one row (`index_pg.pack`)
    return len(scopes)
