-- lock_acquire_v1: a lock's acquire in one statement (it was seven round trips: begin, the
-- clock, the advisory lock, a read per slot, the write, commit).
-- Acquires of one name are serialized by the transaction's advisory lock (p_advisory, from
-- queen_core::locks::advisory_key); the permit rows of slots 0..limit-1 (p_keys, in slot
-- order) are then locked one by one, so a racing renew, release or sweep waits and the rows
-- decided on are the rows written over. The verdict mirrors queen_core::locks::decide_acquire:
--   1. a live permit of this owner (lowest slot first): answered as it is, nothing written;
--   2. else the lowest slot without a live permit: taken at the next version with the permit's value,
--      expiring p_ttl_seconds from the database's time;
--   3. else refused.
-- Answers one row per permit row found (taken = false: the rows as decided on) and, when a
-- slot was taken, the written row (taken = true). The broker runs decide_acquire over the
-- rows found and requires the same verdict.
CREATE OR REPLACE FUNCTION queen.lock_acquire_v1(
    p_ns text, p_keys text[], p_advisory bigint, p_owner text, p_ttl_seconds bigint)
RETURNS TABLE (at timestamptz, slot integer, taken boolean, value text, version bigint,
               expires_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := queen.now();
    r queen.kv%ROWTYPE;
    v_slot integer;
    v_free integer;
    v_free_exists boolean := false;
    -- queen_core::locks::permit_value: the owner and the database's time, as RFC 3339 in UTC
    -- with microseconds (the broker requires the written value to equal its own rendering).
    v_value jsonb := jsonb_build_object(
        'owner', p_owner,
        'since', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
BEGIN
    PERFORM pg_advisory_xact_lock(p_advisory);
    FOR v_slot IN 0 .. coalesce(array_length(p_keys, 1), 0) - 1 LOOP
        SELECT * INTO r FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_keys[v_slot + 1]
           FOR UPDATE;
        IF NOT FOUND THEN
            IF v_free IS NULL THEN
                v_free := v_slot;
            END IF;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT v_now, v_slot, false, r.value::text, r.version, r.expires_at,
                            r.updated_at;
        IF r.expires_at IS NULL OR r.expires_at > v_now THEN
            IF jsonb_typeof(r.value -> 'owner') = 'string' AND r.value ->> 'owner' = p_owner THEN
                -- Already held by this owner: the verdict needs no later row.
                RETURN;
            END IF;
        ELSIF v_free IS NULL THEN
            v_free := v_slot;
            v_free_exists := true;
        END IF;
    END LOOP;
    IF v_free IS NULL THEN
        RETURN;
    END IF;
    IF v_free_exists THEN
        RETURN QUERY
        UPDATE queen.kv k SET value = v_value, version = nextval('queen.kv_versions'),
               expires_at = v_now + p_ttl_seconds * interval '1 second', updated_at = v_now
         WHERE k.ns = p_ns AND k.key = p_keys[v_free + 1]
         RETURNING v_now, v_free, true, k.value::text, k.version, k.expires_at, k.updated_at;
        IF NOT FOUND THEN
            -- An expired row was locked above: it cannot change under this transaction.
            RAISE EXCEPTION 'lock_acquire_v1: permit % changed under its lock', p_keys[v_free + 1];
        END IF;
    ELSE
        -- The version is drawn in the insert itself (kv_insert_v1 draws it after, in a second
        -- write, for a key a concurrent delete may still hold): the locked read above found no
        -- row, so no delete of this key is in flight, and every version the key had is older.
        -- Acquires insert permits one at a time (the advisory lock); a KV write of the same
        -- key that committed meanwhile makes the insert do nothing, and the acquire is run
        -- again (serialization_failure: the broker's contention retry).
        RETURN QUERY
        INSERT INTO queen.kv AS k (ns, key, value, version, expires_at, created_at, updated_at)
        VALUES (p_ns, p_keys[v_free + 1], v_value, nextval('queen.kv_versions'),
                v_now + p_ttl_seconds * interval '1 second', v_now, v_now)
        ON CONFLICT (ns, key) DO NOTHING
        RETURNING v_now, v_free, true, k.value::text, k.version, k.expires_at, k.updated_at;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'lock_acquire_v1: permit % was written meanwhile', p_keys[v_free + 1]
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
END
$$;
