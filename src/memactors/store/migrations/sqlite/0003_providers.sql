
        CREATE TABLE builtin_embed_cache (
            content_hash TEXT NOT NULL,
            model TEXT NOT NULL,
            dim INTEGER NOT NULL,
            vector BLOB NOT NULL,          -- float32 little-endian, sqlite-vec's serialisation
            PRIMARY KEY (content_hash, model)
        );
        CREATE TABLE builtin_meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE INDEX pending_due ON pending (provider, state, next_at);
        