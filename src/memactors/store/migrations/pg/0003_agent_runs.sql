
        CREATE TABLE agent_runs (
            harness TEXT COLLATE "C" NOT NULL,
            run_id TEXT COLLATE "C" NOT NULL,
            state TEXT COLLATE "C" NOT NULL,
            started_at TEXT COLLATE "C" NOT NULL,
            ended_at TEXT COLLATE "C",
            view TEXT COLLATE "C" NOT NULL,
            stderr_tail TEXT COLLATE "C",
            log TEXT COLLATE "C",
            PRIMARY KEY (harness, run_id)
        );
        CREATE INDEX agent_runs_by_start ON agent_runs (started_at);
        CREATE INDEX agent_runs_by_run ON agent_runs (run_id);
        CREATE FUNCTION agent_runs_forget() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE agent_runs SET stderr_tail = NULL, log = NULL WHERE harness = NEW.harness AND run_id = NEW.run_id;
            RETURN NULL;
        END $$;
        CREATE TRIGGER agent_runs_forget AFTER UPDATE OF record_id ON runs FOR EACH ROW
            WHEN (NEW.record_id IS NULL AND OLD.record_id IS NOT NULL) EXECUTE FUNCTION agent_runs_forget();
    