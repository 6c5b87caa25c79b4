
        CREATE TABLE episode_bodies (id INTEGER PRIMARY KEY, body TEXT NOT NULL);  -- REQ-5 object as JSON
        CREATE TABLE run_records (id INTEGER PRIMARY KEY, record TEXT NOT NULL);   -- redacted, no prompt
        ALTER TABLE episodes ADD COLUMN body_id INTEGER;  -- NULL once forgotten
        ALTER TABLE runs ADD COLUMN record_id INTEGER;    -- NULL once its episode is forgotten
        INSERT INTO episode_bodies (id, body) SELECT rowid, body FROM episodes WHERE body IS NOT NULL ORDER BY rowid;
        UPDATE episodes SET body_id = rowid WHERE body IS NOT NULL;
        INSERT INTO run_records (id, record) SELECT rowid, record FROM runs ORDER BY rowid;
        UPDATE runs SET record_id = rowid;
        ALTER TABLE episodes DROP COLUMN body;
        ALTER TABLE runs DROP COLUMN record;
        