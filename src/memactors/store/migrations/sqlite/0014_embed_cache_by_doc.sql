-- The built-in provider's embedding cache stores each vector once: a row whose document has its vector
-- in builtin_vec points at it (doc_id, vector empty); a row keeps its own copy only when no document
-- holds it any more. The vectors themselves are moved at start (`builtin.index_sqlite.cache_once`),
-- where the embedding text that keys them is known.
ALTER TABLE builtin_embed_cache ADD COLUMN doc_id INTEGER;
CREATE INDEX builtin_embed_cache_by_doc ON builtin_embed_cache (doc_id) WHERE doc_id IS NOT NULL;
