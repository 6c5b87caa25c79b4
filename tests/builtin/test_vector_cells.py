"""The built-in provider's approximate vector search for a large scope (`builtin.vector_cells`): the
back-fill divides a scope that reaches CELLS_FROM vectors into k-means cells, a knn then reads only the
cells nearest the query, and a store made before the cells (SQLite: vec0 without the cell; PostgreSQL:
float32 `vector` under a store-wide HNSW index) is brought to them at start with its vectors kept.

On SQLite and on PostgreSQL with pgvector, through the service (`MemoryService.recall`, what the
operator's `Recall` runs), the thresholds lowered so a small store shows what a large one does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memactors.builtin import index_of, index_pg, index_sqlite, vector_cells
from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.testing.fake_model_api import FakeModelApi, embedding_for
from support import run_record, wait_ready, write_config

pytestmark = pytest.mark.req11

API = "forge.example/acme/api"
WEB = "forge.example/acme/web"
TOPICS = [("ledger", "rounding", "invoice", "decimal"), ("websocket", "reconnect", "heartbeat", "backoff"),
          ("migration", "schema", "column", "index"), ("thumbnail", "resize", "upload", "jpeg"),
          ("timezone", "offset", "calendar", "daylight"), ("lockfile", "resolver", "pin", "wheel")]
PER_TOPIC = 10


@pytest.fixture
def small_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scope is divided from 40 vectors on, into cells of ~8, and a knn reads 0.75 × √cells of them:
    the 60-episode scope below becomes 7 cells of which a knn reads 2."""
    monkeypatch.setattr(vector_cells, "CELLS_FROM", 40)
    monkeypatch.setattr(vector_cells, "CELL_ROWS", 8)
    monkeypatch.setattr(vector_cells, "PROBE_FACTOR", 0.75)


def _holder(tmp_path: Path, fake_api: FakeModelApi, url: str | None) -> ConfigHolder:
    path = write_config(tmp_path, f'[model_api]\nbase_url = "{fake_api.base_url}"\nembedding_model = "fake-embed"\n',
                        store_url=url)
    return ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))


async def _ingest_topics(memory: MemoryService) -> None:
    n = 0
    for words in TOPICS:
        for k in range(PER_TOPIC):
            n += 1
            text = f"{' '.join(words)} {' '.join(words[:2])} note{n}"
            started = f"2026-11-{1 + k:02d}T{n % 24:02d}:00:00Z"
            result = await memory.ingest_run(run_record(run_id=str(n), trace_id=f"t-{n}", result_text=text,
                                                        started_at=started, ended_at=started))
            assert result["outcome"] == "recorded"


async def _answers(memory: MemoryService) -> list[list[str]]:
    out = []
    for words in TOPICS:
        found = await memory.recall(query=" ".join(words[:2]), repo=API, limit=5)
        out.append([e["episode_id"] for e in found["episodes"]])
    return out


def _knn(memory: MemoryService, words: tuple[str, ...], scope: str) -> Any:
    vector = embedding_for(" ".join(words[:2]), 64, "bag_of_words")
    index = index_of(memory.store.engine)
    return lambda db: [h.episode_id for h in index.knn(db, vector, [scope])][:8]


async def test_a_large_scope_divided_into_cells_recalls_what_the_exact_search_recalled(
        tmp_path: Path, bag_of_words_api: FakeModelApi, vector_store_url: str | None,
        small_cells: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixty episodes of six topics in one repository: searched exactly first (the scope below the
    threshold), then divided by the back-fill once the threshold is lowered. Each topic's recall and the
    knn's best 8 are the exact search's, while the knn reads 2 of the scope's 7 cells; the other
    repository (one episode) stays one cell."""
    monkeypatch.setattr(vector_cells, "CELLS_FROM", 1000)
    async with open_memory_service(_holder(tmp_path, bag_of_words_api, vector_store_url)) as memory:
        await wait_ready(memory)
        await _ingest_topics(memory)
        assert await memory.builtin.wait_embedded() == 0
        scope = (await memory.store.read(lambda db: db.execute("SELECT scope FROM builtin_docs LIMIT 1").fetchone()))[0]
        assert await memory.store.read(lambda db: db.execute("SELECT count(*) FROM builtin_vec_cells").fetchone()[0]) == 0
        exact_answers = await _answers(memory)
        exact_knn = [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS]
        assert all(exact_answers) and all(len(k) == 8 for k in exact_knn)

        monkeypatch.setattr(vector_cells, "CELLS_FROM", 40)
        sessions = [{"session_id": "s9", "cwd": "/srv/web", "repo": WEB, "git_branch": "main"}]
        result = await memory.ingest_run(run_record(run_id="web-1", trace_id="t-web", sessions=sessions,
                                                    result_text="ledger rounding elsewhere"))
        assert result["outcome"] == "recorded"
        assert await memory.builtin.wait_embedded() == 0  # the pass that embedded it divided the scope

        def cells(db: Any) -> tuple[Any, ...]:
            divisions = db.execute("SELECT scope, vectors, cells FROM builtin_vec_divisions").fetchall()
            used = db.execute("SELECT count(DISTINCT cell) FROM builtin_vec WHERE scope = ?", [scope]).fetchone()[0]
            return [tuple(d) for d in divisions], int(used)

        divisions, used = await memory.store.read(cells)
        assert divisions == [(scope, 60, 7)]  # 60 // 8 cells; the web repository is not divided
        assert vector_cells.probes(7) == 2 and used > 2
        assert await _answers(memory) == exact_answers
        assert [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS] == exact_knn


async def test_a_store_made_before_the_cells_is_upgraded_at_start_with_its_vectors_kept(
        tmp_path: Path, bag_of_words_api: FakeModelApi, vector_store_url: str | None) -> None:
    """A store whose vectors are in the form before the cells (SQLite: vec0 partitioned by scope alone;
    PostgreSQL: float32 `vector` with the store-wide HNSW index and no cell) is converted when the
    service starts: no episode waits for a vector again, none is embedded again, every scope is one cell
    (halfvec on PostgreSQL), and recall answers as before."""
    holder = _holder(tmp_path, bag_of_words_api, vector_store_url)
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        await _ingest_topics(memory)
        assert await memory.builtin.wait_embedded() == 0
        before = await _answers(memory)
        engine = memory.store.engine
        await memory.store.write(_old_form)
    requests = len(bag_of_words_api.requests_to("/v1/embeddings"))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        assert await memory.builtin.wait_embedded() == 0
        status = await memory.builtin.vector_status()
        assert status["with_vector"] == 60 and status["pending"] == 0

        def form(db: Any) -> tuple[str, int]:
            layout = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_layout'").fetchone()[0]
            return layout, int(db.execute("SELECT count(*) FROM builtin_vec_divisions").fetchone()[0])

        layout = index_pg.VEC_LAYOUT if engine == "postgresql" else index_sqlite.VEC_LAYOUT
        assert await memory.store.read(form) == (layout, 0)
        if engine == "postgresql":
            kind = await memory.store.read(lambda db: db.execute(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'builtin_vec'::regclass"
                " AND attname = 'embedding'").fetchone()[0])
            assert kind == "halfvec(64)"
        assert await _answers(memory) == before
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == requests + len(TOPICS)  # the recalls' queries only


def _old_form(db: Any) -> None:
    """Rewrite the store's vectors into the form before the cells, as a store made then holds them."""
    db.execute("DELETE FROM builtin_meta WHERE key = 'vec_layout'")
    db.execute("DELETE FROM builtin_vec_cells")
    db.execute("DELETE FROM builtin_vec_divisions")
    dim = int(db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()[0])
    if db.dialect.name == "postgresql":
        db.execute("DROP INDEX builtin_vec_by_cell")
        db.execute("ALTER TABLE builtin_vec DROP COLUMN cell")
        db.execute(f"ALTER TABLE builtin_vec ALTER COLUMN embedding TYPE vector({dim}) USING embedding::vector({dim})")
        db.execute("CREATE INDEX builtin_vec_hnsw ON builtin_vec USING hnsw (embedding vector_cosine_ops)")
        db.execute("CREATE INDEX builtin_vec_by_scope ON builtin_vec (scope)")
        db.execute("DELETE FROM builtin_meta WHERE key = 'vec_form'")
        return
    rows = db.execute("SELECT doc_id, scope, embedding FROM builtin_vec").fetchall()
    db.execute("DROP TABLE builtin_vec")
    db.execute(f"CREATE VIRTUAL TABLE builtin_vec USING vec0(doc_id INTEGER PRIMARY KEY, scope TEXT PARTITION KEY,"
               f" embedding int8[{dim}] distance_metric=cosine, chunk_size=128)")
    for doc_id, scope, blob in rows:
        db.execute("INSERT INTO builtin_vec (doc_id, scope, embedding) VALUES (?, ?, vec_int8(?))",
                   [doc_id, scope, bytes(blob)])


async def test_a_sqlite_store_with_cells_in_vec0_keeps_its_cells_when_upgraded_at_start(
        tmp_path: Path, bag_of_words_api: FakeModelApi, small_cells: None) -> None:
    """A SQLite store whose divided scope's vectors are in the sqlite-vec `vec0` table with the cell as a
    metadata column (the layout before the plain table) is converted when the service starts: every
    vector keeps its cell, the division is kept (not fitted again), nothing is embedded again, and recall
    and the knn answer what they did."""
    holder = _holder(tmp_path, bag_of_words_api, None)
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        await _ingest_topics(memory)
        assert await memory.builtin.wait_embedded() == 0
        scope = (await memory.store.read(lambda db: db.execute("SELECT scope FROM builtin_docs LIMIT 1").fetchone()))[0]
        before = await _answers(memory)
        knn_before = [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS]
        cells_before = await memory.store.read(_cells)
        divisions = await memory.store.read(_divisions)
        assert len(divisions) == 1 and len({cell for _, cell in cells_before}) > 2  # divided while ingested
        await memory.store.write(_vec0_with_cells)
    requests = len(bag_of_words_api.requests_to("/v1/embeddings"))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        assert await memory.builtin.wait_embedded() == 0
        layout = await memory.store.read(lambda db: db.execute(
            "SELECT value FROM builtin_meta WHERE key = 'vec_layout'").fetchone()[0])
        assert layout == index_sqlite.VEC_LAYOUT
        assert await memory.store.read(lambda db: db.execute(
            "SELECT type FROM sqlite_master WHERE name = 'builtin_vec'").fetchone()[0]) == "table"
        assert await memory.store.read(_cells) == cells_before
        assert await memory.store.read(_divisions) == divisions
        assert await _answers(memory) == before
        assert [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS] == knn_before
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == requests + len(TOPICS)  # the recalls' queries only


def _cells(db: Any) -> list[tuple[int, int]]:
    return [(int(d), int(c)) for d, c in db.execute("SELECT doc_id, cell FROM builtin_vec ORDER BY doc_id").fetchall()]


def _divisions(db: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in db.execute("SELECT scope, vectors, cells FROM builtin_vec_divisions").fetchall()]


def _vec0_with_cells(db: Any) -> None:
    """Rewrite the vectors into the `vec0` table with the cell as a metadata column, as the store held them then."""
    dim = int(db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()[0])
    rows = db.execute("SELECT doc_id, scope, cell, embedding FROM builtin_vec").fetchall()
    db.execute("DROP TABLE builtin_vec")
    db.execute(f"CREATE VIRTUAL TABLE builtin_vec USING vec0(doc_id INTEGER PRIMARY KEY, scope TEXT PARTITION KEY,"
               f" cell INTEGER, embedding int8[{dim}] distance_metric=cosine, chunk_size=128)")
    for doc_id, scope, cell, blob in rows:
        db.execute("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) VALUES (?, ?, ?, vec_int8(?))",
                   [doc_id, scope, cell, bytes(blob)])
    db.execute("UPDATE builtin_meta SET value = 'cell-meta' WHERE key = 'vec_layout'")


async def test_postgresql_keeps_each_scopes_vector_count_as_vectors_come_and_go(
        tmp_path: Path, bag_of_words_api: FakeModelApi, vector_url: str) -> None:
    """On PostgreSQL the back-fill asks which scopes reached their next division from one count a scope
    (`builtin_vec_counts`, kept by triggers), not by counting the store: the counts follow what is
    embedded and forgotten, a scope that reaches the threshold is divided by them, and a store made
    before the counts gets them at start from its vectors."""
    holder = _holder(tmp_path, bag_of_words_api, vector_url)

    def counts(db: Any) -> dict[str, int]:
        return {str(s): int(n) for s, n in db.execute("SELECT scope, vectors FROM builtin_vec_counts").fetchall()}

    def actual(db: Any) -> dict[str, int]:
        return {str(s): int(n) for s, n in db.execute("SELECT scope, count(*) FROM builtin_vec GROUP BY scope").fetchall()}

    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        await _ingest_topics(memory)
        assert await memory.builtin.wait_embedded() == 0
        scope = (await memory.store.read(lambda db: db.execute("SELECT scope FROM builtin_docs LIMIT 1").fetchone()))[0]
        assert await memory.store.read(counts) == {scope: 60}
        found = await memory.recall(query="ledger rounding", repo=API, limit=2)
        for episode in found["episodes"]:
            assert (await memory.forget(episode["episode_id"]))["forgotten"]
        assert await memory.store.read(counts) == await memory.store.read(actual) == {scope: 58}
        assert await memory.store.read(lambda db: index_pg.scopes_to_divide(db)) == []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(vector_cells, "CELLS_FROM", 40)
            patch.setattr(vector_cells, "CELL_ROWS", 8)
            assert await memory.store.read(lambda db: index_pg.scopes_to_divide(db)) == [scope]
            assert await vector_cells.divide_scopes(memory.store, index_pg.PG_INDEX) == 1
            assert await memory.store.read(lambda db: db.execute(
                "SELECT vectors, cells FROM builtin_vec_divisions").fetchall()) == [(58, 7)]
            assert await memory.store.read(lambda db: index_pg.scopes_to_divide(db)) == []

        def before_counts(db: Any) -> None:  # the store as a daemon before the counts left it
            db.execute("DROP TRIGGER builtin_vec_count_insert ON builtin_vec")
            db.execute("DROP TRIGGER builtin_vec_count_delete ON builtin_vec")
            db.execute("DROP TRIGGER builtin_vec_count_move ON builtin_vec")
            db.execute("DROP TABLE builtin_vec_counts")
            db.execute("DROP FUNCTION builtin_vec_counted(), builtin_vec_count()")
            db.execute("DELETE FROM memactors_migrations WHERE name = '0009_vector_counts'")

        await memory.store.write(before_counts)
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        assert await memory.store.read(counts) == {scope: 58}
        await memory.ingest_run(run_record(run_id="late", trace_id="t-late", result_text="ledger rounding late"))
        assert await memory.builtin.wait_embedded() == 0
        assert await memory.store.read(counts) == await memory.store.read(actual) == {scope: 59}


async def test_postgresql_reads_a_cells_vectors_from_one_packed_row_and_packs_a_store_from_before_at_start(
        tmp_path: Path, bag_of_words_api: FakeModelApi, vector_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL a cell's vectors are packed in one row (`builtin_vec_packs`: doc ids and float16
    values as the rows hold them), so a knn reads ~100 rows of a large scope, not ~26k: the back-fill
    packs a cell once enough vectors were written since, a vector written after stays a row of its own
    until then and is found all the same, a forgotten episode's vector leaves its pack (REQ-10), and a
    store made before the packs (migration 0010) answers the same at start and is packed by its first pass."""
    holder = _holder(tmp_path, bag_of_words_api, vector_url)

    def in_packs(db: Any) -> list[int]:
        return sorted(int(d) for r in db.execute("SELECT doc_ids FROM builtin_vec_packs").fetchall() for d in r[0])

    def rows(db: Any) -> tuple[list[int], list[int]]:
        found = db.execute("SELECT doc_id, packed FROM builtin_vec ORDER BY doc_id").fetchall()
        return [int(r[0]) for r in found if r[1]], [int(r[0]) for r in found if not r[1]]

    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        await _ingest_topics(memory)
        assert await memory.builtin.wait_embedded() == 0
        scope = (await memory.store.read(lambda db: db.execute("SELECT scope FROM builtin_docs LIMIT 1").fetchone()))[0]
        packed, loose = await memory.store.read(rows)  # packed as the passes went, the rest rows of their own
        assert len(packed) + len(loose) == 60 and len(packed) >= index_pg.PACK_LOOSE > len(loose)
        assert await memory.store.read(in_packs) == packed
        (gone,) = await memory.store.read(lambda db: db.execute(
            "SELECT d.episode_id FROM builtin_docs d JOIN builtin_vec v ON v.doc_id = d.doc_id WHERE v.packed"
            " ORDER BY d.doc_id LIMIT 1").fetchone())
        assert (await memory.forget(gone))["forgotten"]
        packed, loose = await memory.store.read(rows)
        assert len(packed) + len(loose) == 59 and await memory.store.read(in_packs) == packed
        monkeypatch.setattr(index_pg, "PACK_LOOSE", 1000)  # the next vector stays a row of its own
        late = await memory.ingest_run(run_record(run_id="late", trace_id="t-late", result_text="ledger rounding late"))
        assert late["outcome"] == "recorded"
        assert await memory.builtin.wait_embedded() == 0
        before = loose
        packed, loose = await memory.store.read(rows)
        assert len(loose) == len(before) + 1
        (late_doc,) = set(loose) - set(before)
        vector = embedding_for("ledger rounding late", 64, "bag_of_words")
        nearest = await memory.store.read(lambda db: index_pg.knn(db, vector, [scope]))
        assert nearest[0].doc_id == late_doc and gone not in {h.episode_id for h in nearest}
        monkeypatch.undo()
        answers = await _answers(memory)
        knn = [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS]

        def before_packs(db: Any) -> None:  # the store as a daemon before the packs left it
            db.execute("DROP TRIGGER builtin_vec_unpack ON builtin_vec")
            db.execute("DROP INDEX builtin_vec_loose")
            db.execute("ALTER TABLE builtin_vec DROP COLUMN packed")
            db.execute("DROP TABLE builtin_vec_packs")
            db.execute("DROP FUNCTION builtin_vec_packed(), builtin_vec_unpack()")
            db.execute("ALTER TABLE builtin_docs DROP COLUMN meta_tsv")  # its index with it
            db.execute("DELETE FROM memactors_migrations WHERE name = '0010_vector_packs'")

        await memory.store.write(before_packs)
    async with open_memory_service(holder) as memory:
        assert await memory.builtin.wait_embedded() == 0
        packed, loose = await memory.store.read(rows)
        assert len(packed) == 60 and loose == [] and await memory.store.read(in_packs) == packed
        assert await _answers(memory) == answers
        assert [await memory.store.read(_knn(memory, words, scope)) for words in TOPICS] == knn
