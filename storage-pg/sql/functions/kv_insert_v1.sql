-- kv_insert_v1: inserts an absent key; no row when another transaction holds or committed it
-- meanwhile (the caller reads it again and decides anew).
-- The version is drawn after the insert went through, not in its VALUES: an insert that waited
-- for a concurrent delete of the key would otherwise carry a version drawn before the deleted
-- row's, and a key's version must rise across deletes (a compare-and-set never matches a
-- recycled version, a lock's fencing token never falls).
CREATE OR REPLACE FUNCTION queen.kv_insert_v1(
    p_ns text, p_key text, p_value jsonb, p_expires_at timestamptz, p_now timestamptz)
RETURNS TABLE (value text, version bigint, expires_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO queen.kv (ns, key, value, version, expires_at, created_at, updated_at)
    VALUES (p_ns, p_key, p_value, 0, p_expires_at, p_now, p_now)
    ON CONFLICT (ns, key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE queen.kv k SET version = nextval('queen.kv_versions')
     WHERE k.ns = p_ns AND k.key = p_key
     RETURNING k.value::text, k.version, k.expires_at, k.updated_at;
END
$$;
