
        CREATE TABLE runs (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT NOT NULL,
            outcome TEXT NOT NULL,
            reason TEXT NOT NULL,
            duration_ms INTEGER NOT NULL,
            repo TEXT,
            branch TEXT,
            record TEXT NOT NULL,          -- redacted run record JSON, without the prompt
            ingested_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id)
        );
        CREATE INDEX runs_repo_branch ON runs (repo, branch, ended_at);
        CREATE TABLE run_paths (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            path TEXT NOT NULL,
            PRIMARY KEY (harness, run_id, repo, path),
            FOREIGN KEY (harness, run_id) REFERENCES runs (harness, run_id) ON DELETE CASCADE
        );
        CREATE INDEX run_paths_by_path ON run_paths (repo, path);
        CREATE TABLE episodes (
            episode_id TEXT PRIMARY KEY,
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            branch TEXT NOT NULL,
            scope TEXT NOT NULL,
            trust_class TEXT NOT NULL,
            outcome TEXT NOT NULL,
            started_at TEXT NOT NULL,
            recorded_at TEXT NOT NULL,     -- when memactors assembled and stored it (retention clock)
            body TEXT,                     -- REQ-5 object as JSON; NULL once forgotten
            text TEXT,                     -- plain-text rendering; NULL once forgotten
            forgotten_at TEXT
        );
        CREATE INDEX episodes_by_scope ON episodes (scope, started_at);
        CREATE INDEX episodes_by_harness ON episodes (harness, started_at);
        CREATE INDEX episodes_by_recorded ON episodes (recorded_at);
        CREATE TABLE memory_index (
            provider TEXT NOT NULL,
            provider_id TEXT NOT NULL,
            episode_id TEXT NOT NULL REFERENCES episodes (episode_id),
            scope TEXT NOT NULL,
            recorded_at TEXT NOT NULL,
            forgotten_at TEXT,
            PRIMARY KEY (provider, provider_id)
        );
        CREATE INDEX memory_index_by_episode ON memory_index (episode_id);
        CREATE TABLE pending (
            kind TEXT NOT NULL CHECK (kind IN ('record', 'forget')),
            provider TEXT NOT NULL,
            episode_id TEXT NOT NULL,
            provider_id TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            first_at TEXT NOT NULL,
            next_at TEXT NOT NULL,
            last_error TEXT,
            PRIMARY KEY (kind, provider, episode_id, provider_id)
        );
        CREATE TABLE builtin_docs (
            doc_id INTEGER PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            scope TEXT NOT NULL,
            text TEXT NOT NULL,
            summary TEXT NOT NULL DEFAULT '',
            files TEXT NOT NULL DEFAULT '[]',
            started_at TEXT NOT NULL,
            content_hash TEXT NOT NULL
        );
        CREATE INDEX builtin_docs_by_scope ON builtin_docs (scope);
        CREATE VIRTUAL TABLE builtin_fts USING fts5 (text, summary, tokenize = 'porter unicode61');
        CREATE TABLE call_log (
            id INTEGER PRIMARY KEY,
            at TEXT NOT NULL,
            caller TEXT NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            args_sha256 TEXT NOT NULL,
            outcome TEXT NOT NULL,
            duration_ms INTEGER NOT NULL
        );
        