-- The built-in provider's vectors packed a cell to a row (`builtin.index_pg`, "packs"): a knn read its
-- probed cells' vectors a row each, ~4 µs a row on this server whatever scores it — ~100 ms for the ~26k
-- vectors a 170k-vector scope's knn reads, ~70 ms for a 17k-vector scope not divided — where the same
-- vectors in ~100 rows take ~25 ms (docs/benchmarks.md, "A million episodes").
--
-- builtin_vec_packs holds, for each (scope, cell), its vectors' doc ids and their values exactly as the
-- rows hold them (pgvector's halfvec binary form without its 4-byte header: big-endian float16, the
-- ids' order), so a vector scores the same from its pack as from its row. A row in its pack is `packed`;
-- a vector written since its cell was packed stays a row of its own (the partial index
-- builtin_vec_loose finds them) until the back-fill packs the cell again (`index_pg.pack_cells`). A
-- packed row deleted (a forgotten episode, REQ-10) leaves its pack with it, by the trigger below.
--
-- builtin_vec is created at run time (with pgvector, once the dimension is known): its `packed` column,
-- index and trigger are made by builtin_vec_packed(), called here for a table made before (its rows
-- start loose; the first back-fill pass packs them) and by `builtin.index_pg._create_vec_table`.
CREATE TABLE builtin_vec_packs (
    scope   TEXT COLLATE "C" NOT NULL,
    cell    INTEGER NOT NULL,
    doc_ids BIGINT[] NOT NULL,
    vectors BYTEA NOT NULL,
    PRIMARY KEY (scope, cell)
);
ALTER TABLE builtin_vec_packs ALTER COLUMN vectors SET STORAGE EXTERNAL;  -- float16 does not compress

CREATE FUNCTION builtin_vec_unpack() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gone RECORD;
BEGIN
    FOR gone IN SELECT doc_id, scope, cell FROM builtin_vec_old WHERE packed LOOP
        UPDATE builtin_vec_packs p SET
            doc_ids = p.doc_ids[:f.k - 1] || p.doc_ids[f.k + 1:],
            vectors = substring(p.vectors FROM 1 FOR (f.k - 1) * f.w) || substring(p.vectors FROM f.k * f.w + 1)
        FROM (SELECT array_position(doc_ids, gone.doc_id) AS k, octet_length(vectors) / cardinality(doc_ids) AS w
              FROM builtin_vec_packs WHERE scope = gone.scope AND cell = gone.cell) f
        WHERE p.scope = gone.scope AND p.cell = gone.cell AND f.k IS NOT NULL;
    END LOOP;
    RETURN NULL;
END $$;

CREATE FUNCTION builtin_vec_packed() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM builtin_vec_packs;
    ALTER TABLE builtin_vec ADD COLUMN IF NOT EXISTS packed BOOLEAN NOT NULL DEFAULT false;
    UPDATE builtin_vec SET packed = false WHERE packed;
    CREATE INDEX IF NOT EXISTS builtin_vec_loose ON builtin_vec (scope, cell) WHERE NOT packed;
    CREATE TRIGGER builtin_vec_unpack AFTER DELETE ON builtin_vec REFERENCING OLD TABLE AS builtin_vec_old
        FOR EACH STATEMENT EXECUTE FUNCTION builtin_vec_unpack();
END $$;

DO $$
BEGIN
    IF to_regclass('builtin_vec') IS NOT NULL THEN
        PERFORM builtin_vec_packed();
    END IF;
END $$;

-- The metadata words alone, searchable by their own GIN index: `builtin.index_pg.metadata_only` asks
-- whether a word is in some episode's metadata (weight class D of `tsv`), and GIN keeps no weights, so
-- `tsv @@ 'word:D'` re-checked every document of the scope holding the word anywhere (at 1M episodes up
-- to 2.4 s for a common word in a 170k-episode repository). The same lexemes as `tsv`'s D part, with the
-- scope's token (`index_pg.SCOPE_TOKEN_SQL`).
ALTER TABLE builtin_docs ADD COLUMN IF NOT EXISTS meta_tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('english', regexp_replace(meta, '[^[:alnum:]]+', ' ', 'g')) ||
    to_tsvector('simple', 'sk' || substr(encode(sha256(scope::bytea), 'hex'), 1, 15))) STORED;
CREATE INDEX IF NOT EXISTS builtin_docs_meta_tsv ON builtin_docs USING gin (meta_tsv);
