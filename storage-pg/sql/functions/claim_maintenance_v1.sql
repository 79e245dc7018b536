-- The cluster-wide maintenance lease: one broker at a time runs a maintenance job (retention).
-- Taken when free or run out, renewed by its holder; never waits (a contender's insert that
-- meets the row's lock waits only for the holder's own short statement).
CREATE OR REPLACE FUNCTION queen.claim_maintenance_v1(p_name text, p_holder text, p_seconds integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO queen.maintenance_leases AS l (name, holder, until)
    VALUES (p_name, p_holder, queen.now() + make_interval(secs => p_seconds))
    ON CONFLICT (name) DO UPDATE
       SET holder = EXCLUDED.holder, until = EXCLUDED.until
     WHERE l.until <= queen.now() OR l.holder = p_holder;
    RETURN FOUND;
END
$$;
