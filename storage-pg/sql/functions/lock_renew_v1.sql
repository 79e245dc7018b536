-- lock_renew_v1: a permit's renew in one statement (it was five round trips).
-- The permit row (p_key) is locked; the renew holds, as queen_core::locks::renew_holds says,
-- when the row is live at the database's time and carries the token (p_token) or belongs to
-- the owner (p_owner, NULL: the token alone). A renew that holds writes the row at the next
-- version (a new fencing token), its value kept, expiring p_ttl_seconds from now.
-- Answers the row as decided on (taken = false; none when absent) and, when renewed, the
-- written row (taken = true). A renew that does not hold answers every permit row of the lock
-- (p_prefix: '<name>#', taken = false, keys in p_key's place) for the broker's list of
-- holders. The broker runs renew_holds over the row decided on and requires the same verdict.
CREATE OR REPLACE FUNCTION queen.lock_renew_v1(
    p_ns text, p_key text, p_prefix text, p_token bigint, p_owner text, p_ttl_seconds bigint)
RETURNS TABLE (at timestamptz, key text, taken boolean, value text, version bigint,
               expires_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := queen.now();
    r queen.kv%ROWTYPE;
BEGIN
    SELECT * INTO r FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_key FOR UPDATE;
    IF FOUND AND (r.expires_at IS NULL OR r.expires_at > v_now)
       AND (r.version = p_token
            OR (p_owner IS NOT NULL AND jsonb_typeof(r.value -> 'owner') = 'string'
                AND r.value ->> 'owner' = p_owner))
    THEN
        RETURN QUERY SELECT v_now, r.key::text, false, r.value::text, r.version, r.expires_at,
                            r.updated_at;
        RETURN QUERY
        UPDATE queen.kv k SET version = nextval('queen.kv_versions'),
               expires_at = v_now + p_ttl_seconds * interval '1 second', updated_at = v_now
         WHERE k.ns = p_ns AND k.key = p_key
         RETURNING v_now, k.key::text, true, k.value::text, k.version, k.expires_at, k.updated_at;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v_now, k.key::text, false, k.value::text, k.version, k.expires_at, k.updated_at
      FROM queen.kv k
     WHERE k.ns = p_ns AND k.key >= p_prefix AND starts_with(k.key, p_prefix)
     ORDER BY k.key;
    IF NOT FOUND THEN
        -- No permit at all: one row with the time alone, for the broker's verdict.
        RETURN QUERY SELECT v_now, NULL::text, false, NULL::text, NULL::bigint,
                            NULL::timestamptz, NULL::timestamptz;
    END IF;
END
$$;
