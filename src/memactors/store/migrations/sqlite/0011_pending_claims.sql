
        ALTER TABLE pending ADD COLUMN claimed_until TEXT;
        ALTER TABLE pending ADD COLUMN claimed_by TEXT;
        