
        CREATE TABLE facts (
            id TEXT PRIMARY KEY,
            fts_rowid INTEGER NOT NULL UNIQUE,   -- facts_fts rowid; explicit so VACUUM cannot move it
            scope TEXT NOT NULL,
            text TEXT NOT NULL,
            confidence REAL NOT NULL CHECK (confidence >= 0.0 AND confidence <= 1.0),
            status TEXT NOT NULL CHECK (status IN ('live', 'suspect', 'retired')),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX facts_by_scope ON facts (scope, status, confidence);
        CREATE VIRTUAL TABLE facts_fts USING fts5 (text, tokenize = 'porter unicode61');
        CREATE TABLE exposures (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            fact_id TEXT NOT NULL,
            surface TEXT NOT NULL
                CHECK (surface IN ('recall', 'briefing_tool', 'briefing_resource', 'briefing_prompt')),
            call_id TEXT,
            at TEXT NOT NULL
        );
        CREATE INDEX exposures_by_run_fact ON exposures (run_id, fact_id);
        CREATE TABLE votes (
            id INTEGER PRIMARY KEY,
            fact_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            stance TEXT NOT NULL CHECK (stance IN ('support', 'oppose')),
            counted INTEGER NOT NULL CHECK (counted IN (0, 1)),
            at TEXT NOT NULL
        );
        CREATE INDEX votes_by_fact ON votes (fact_id);
        CREATE TABLE pull_requests (
            repo TEXT NOT NULL,
            branch TEXT NOT NULL,
            url TEXT NOT NULL,
            linked_at TEXT NOT NULL,
            PRIMARY KEY (repo, branch, url)
        );
        CREATE TABLE presence (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            branch TEXT,
            paths TEXT NOT NULL DEFAULT '[]',
            reported_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id, session_id)
        );
        CREATE INDEX presence_by_repo ON presence (repo, expires_at);
        CREATE TABLE briefings (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            document TEXT NOT NULL,
            doc_json TEXT NOT NULL,
            items TEXT NOT NULL DEFAULT '{}',
            computed_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id)
        );
        CREATE TABLE run_callers (
            token_sha256 TEXT PRIMARY KEY,
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            workdir TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX run_callers_by_run ON run_callers (harness, run_id);
        