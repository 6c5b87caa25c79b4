-- The built-in provider's approximate vector search for large scopes (`builtin.vector_cells`, as SQLite's
-- 0015_vector_cells): a scope with enough vectors is divided into cells by k-means over its own vectors.
-- builtin_vec_cells holds each cell's centroid, builtin_vec_divisions each scope's last division (its
-- vector count then). builtin_vec itself is created at run time (with pgvector, once the dimension is
-- known); a table made before takes its compact form at start (`builtin.index_pg.compact_vec_table`:
-- halfvec, the cell column under a (scope, cell) b-tree in place of the store-wide HNSW index).
CREATE TABLE builtin_vec_cells (
    scope    TEXT COLLATE "C" NOT NULL,
    cell     INTEGER NOT NULL,
    centroid REAL[] NOT NULL,
    PRIMARY KEY (scope, cell)
);
CREATE TABLE builtin_vec_divisions (
    scope   TEXT COLLATE "C" PRIMARY KEY,
    vectors INTEGER NOT NULL,
    cells   INTEGER NOT NULL
);
