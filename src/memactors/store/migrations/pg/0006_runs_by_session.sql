-- An agent's session id is its run id, unique per agent (adapter) whatever the harness: an import asks
-- whether a session is recorded already under any harness (actors/index.sessions_recorded), a lookup by
-- (adapter, run_id) that the primary key (harness, run_id) cannot answer without reading every run.
CREATE INDEX runs_by_session ON runs (adapter, run_id);
