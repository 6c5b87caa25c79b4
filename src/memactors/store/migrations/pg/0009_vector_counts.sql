-- Each scope's vector count, kept by triggers on builtin_vec, so the back-fill's question after every
-- pass ("which scopes reached their next division?", `builtin.index_pg.scopes_to_divide`) reads one row
-- a scope instead of counting every vector of the store (at 1M episodes a scan of the whole table each
-- pass). builtin_vec is created at run time (with pgvector, once the dimension is known): its triggers
-- are made by builtin_vec_counted(), called here for a table made before and by
-- `builtin.index_pg._create_vec_table` for a new one.
CREATE TABLE builtin_vec_counts (
    scope   TEXT COLLATE "C" PRIMARY KEY,
    vectors BIGINT NOT NULL
);

-- One statement's vectors in or out (statement triggers with transition tables: one upsert a statement
-- and scope, not one a row); a row whose scope changes moves between two counts.
CREATE FUNCTION builtin_vec_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO builtin_vec_counts (scope, vectors) SELECT scope, count(*) FROM builtin_vec_new GROUP BY scope
        ON CONFLICT (scope) DO UPDATE SET vectors = builtin_vec_counts.vectors + excluded.vectors;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE builtin_vec_counts c SET vectors = c.vectors - o.n
        FROM (SELECT scope, count(*) AS n FROM builtin_vec_old GROUP BY scope) o WHERE c.scope = o.scope;
    ELSE
        UPDATE builtin_vec_counts SET vectors = vectors - 1 WHERE scope = OLD.scope;
        INSERT INTO builtin_vec_counts (scope, vectors) VALUES (NEW.scope, 1)
        ON CONFLICT (scope) DO UPDATE SET vectors = builtin_vec_counts.vectors + 1;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION builtin_vec_counted() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM builtin_vec_counts;
    INSERT INTO builtin_vec_counts (scope, vectors) SELECT scope, count(*) FROM builtin_vec GROUP BY scope;
    CREATE TRIGGER builtin_vec_count_insert AFTER INSERT ON builtin_vec REFERENCING NEW TABLE AS builtin_vec_new
        FOR EACH STATEMENT EXECUTE FUNCTION builtin_vec_count();
    CREATE TRIGGER builtin_vec_count_delete AFTER DELETE ON builtin_vec REFERENCING OLD TABLE AS builtin_vec_old
        FOR EACH STATEMENT EXECUTE FUNCTION builtin_vec_count();
    CREATE TRIGGER builtin_vec_count_move AFTER UPDATE OF scope ON builtin_vec FOR EACH ROW
        WHEN (OLD.scope IS DISTINCT FROM NEW.scope) EXECUTE FUNCTION builtin_vec_count();
END $$;

DO $$
BEGIN
    IF to_regclass('builtin_vec') IS NOT NULL THEN
        PERFORM builtin_vec_counted();
    END IF;
END $$;
