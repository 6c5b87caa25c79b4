-- The built-in provider's approximate vector search for large scopes (`builtin.vector_cells`): a scope
-- with enough vectors is divided into cells by k-means over its own vectors. builtin_vec_cells holds
-- each cell's centroid (float32, sqlite-vec's serialisation); builtin_vec_divisions says when each
-- scope was last divided (its vector count then), so the back-fill divides it again once it has doubled.
-- builtin_vec itself (created at run time, once the embedding dimension is known) gains the cell as a
-- metadata column; a store made before is rebuilt into that form at start with its vectors kept
-- (`builtin.index_sqlite.compact_vec_table`).
CREATE TABLE builtin_vec_cells (
    scope    TEXT NOT NULL,
    cell     INTEGER NOT NULL,
    centroid BLOB NOT NULL,
    PRIMARY KEY (scope, cell)
) WITHOUT ROWID;
CREATE TABLE builtin_vec_divisions (
    scope   TEXT PRIMARY KEY,
    vectors INTEGER NOT NULL,
    cells   INTEGER NOT NULL
) WITHOUT ROWID;
