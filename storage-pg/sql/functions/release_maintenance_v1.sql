-- Ends a holder's lease early.
CREATE OR REPLACE FUNCTION queen.release_maintenance_v1(p_name text, p_holder text)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE queen.maintenance_leases SET until = '-infinity'
     WHERE name = p_name AND holder = p_holder
$$;
