-- The built-in provider's embedding cache stores each vector once (as SQLite's 0014_embed_cache_by_doc):
-- a row whose document has its vector in builtin_vec points at it (doc_id, vector empty); a row keeps
-- its own copy only when no document holds it (forgotten, retired, or a database without pgvector).
-- The copies already there move at start (`builtin.index_pg.cache_once`).
ALTER TABLE builtin_embed_cache ADD COLUMN doc_id BIGINT;
CREATE INDEX builtin_embed_cache_by_doc ON builtin_embed_cache (doc_id) WHERE doc_id IS NOT NULL;
