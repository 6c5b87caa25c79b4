
        CREATE TABLE memactors_imports (
            source TEXT COLLATE "C" NOT NULL,
            table_name TEXT COLLATE "C" NOT NULL,
            last_id BIGINT NOT NULL,
            PRIMARY KEY (source, table_name)
        );
    