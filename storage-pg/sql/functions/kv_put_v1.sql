-- kv_put_v1: a put without a precondition, which writes whatever the key holds
-- (queen_core::kv::writes_whatever_the_row), in one statement: the key's row updated at a
-- version drawn under its row lock, or inserted (kv_insert_v1). Expiry is p_ttl_seconds from
-- the database's time (NULL: never). Answers that time with the row written.
CREATE OR REPLACE FUNCTION queen.kv_put_v1(
    p_ns text, p_key text, p_value jsonb, p_ttl_seconds bigint)
RETURNS TABLE (at timestamptz, value text, version bigint, expires_at timestamptz,
               updated_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := queen.now();
    v_expires timestamptz := v_now + p_ttl_seconds * interval '1 second';
BEGIN
    LOOP
        RETURN QUERY
        UPDATE queen.kv k SET value = p_value, version = nextval('queen.kv_versions'),
               expires_at = v_expires, updated_at = v_now
         WHERE k.ns = p_ns AND k.key = p_key
         RETURNING v_now, k.value::text, k.version, k.expires_at, k.updated_at;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
        SELECT v_now, i.value, i.version, i.expires_at, i.updated_at
          FROM queen.kv_insert_v1(p_ns, p_key, p_value, v_expires, v_now) i;
        IF FOUND THEN
            RETURN;
        END IF;
        -- A concurrent insert won: update its row.
    END LOOP;
END
$$;
