
        CREATE TABLE agent_runs (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            state TEXT NOT NULL,           -- running | ended
            started_at TEXT NOT NULL,
            ended_at TEXT,
            view TEXT NOT NULL,            -- the operator's view as JSON (no prompt, no agent text)
            stderr_tail TEXT,              -- redacted, at most 4 KiB
            log TEXT,                      -- redacted parsed events, JSON lines, bounded
            PRIMARY KEY (harness, run_id)
        );
        CREATE INDEX agent_runs_by_start ON agent_runs (started_at);
        CREATE INDEX agent_runs_by_run ON agent_runs (run_id);
        CREATE TRIGGER agent_runs_forget AFTER UPDATE OF record_id ON runs
            WHEN new.record_id IS NULL AND old.record_id IS NOT NULL BEGIN
            UPDATE agent_runs SET stderr_tail = NULL, log = NULL
            WHERE harness = new.harness AND run_id = new.run_id;
        END;
        