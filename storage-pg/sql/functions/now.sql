-- queen.now(): PostgreSQL's transaction time plus an offset (table queen.clock) that is always 0
-- in production. The conformance suite moves it to test leases and delays without sleeping.
-- plpgsql, not sql: a sql function with a sub-select is never inlined, so each call parsed,
-- analyzed and planned its body again (7% of PostgreSQL's CPU in a leased-consume profile);
-- plpgsql keeps the plan for the session.
CREATE OR REPLACE FUNCTION queen.now() RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN now() + (SELECT c.offset_us FROM queen.clock c) * interval '1 microsecond';
END
$$;
