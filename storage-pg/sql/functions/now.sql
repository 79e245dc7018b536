-- queen.now(): PostgreSQL's transaction time plus an offset (table queen.clock) that is always 0
-- in production. The conformance suite moves it to test leases and delays without sleeping.
CREATE OR REPLACE FUNCTION queen.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() + (SELECT c.offset_us FROM queen.clock c) * interval '1 microsecond'
$$;
