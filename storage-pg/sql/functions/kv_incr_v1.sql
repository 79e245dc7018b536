-- kv_incr_v1: a call of one `incr` in one statement, the key's row locked only for it (a
-- fixed-window rate limiter is one hot key). The verdict is queen_core::kv::decide's for Incr:
-- an absent or expired key counts as zero and takes the op's expiry (p_ttl_seconds from the
-- database's time; NULL: never), a live one keeps its expiry; a live value that is not an
-- integer literal in bigint range is refused; a sum outside bigint or outside [p_min, p_max]
-- is refused. A refusal answers the row as it stands (live or not: NULL columns when absent),
-- and the broker builds its answer with decide() from that row, which must agree.
CREATE OR REPLACE FUNCTION queen.kv_incr_v1(
    p_ns text, p_key text, p_delta bigint, p_min bigint, p_max bigint, p_ttl_seconds bigint)
RETURNS TABLE (at timestamptz, applied boolean, value text, version bigint,
               expires_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := queen.now();
    r queen.kv%ROWTYPE;
    v_exists boolean;
    v_live boolean;
    v_current numeric;
    v_next numeric;
    v_expires timestamptz;
BEGIN
    LOOP
        SELECT * INTO r FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_key FOR UPDATE;
        v_exists := FOUND;
        v_live := v_exists AND (r.expires_at IS NULL OR r.expires_at > v_now);
        IF v_live THEN
            IF r.value::text !~ '^-?[0-9]{1,19}$'
               OR r.value::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
            THEN
                RETURN QUERY SELECT v_now, false, r.value::text, r.version, r.expires_at, r.updated_at;
                RETURN;
            END IF;
            v_current := r.value::text::numeric;
            v_expires := r.expires_at;
        ELSE
            v_current := 0;
            v_expires := v_now + p_ttl_seconds * interval '1 second';
        END IF;
        v_next := v_current + p_delta;
        IF v_next NOT BETWEEN -9223372036854775808 AND 9223372036854775807
           OR (p_min IS NOT NULL AND v_next < p_min)
           OR (p_max IS NOT NULL AND v_next > p_max)
        THEN
            IF v_exists THEN
                RETURN QUERY SELECT v_now, false, r.value::text, r.version, r.expires_at, r.updated_at;
            ELSE
                RETURN QUERY SELECT v_now, false, NULL::text, NULL::bigint, NULL::timestamptz,
                                    NULL::timestamptz;
            END IF;
            RETURN;
        END IF;
        IF v_exists THEN
            RETURN QUERY
            UPDATE queen.kv k SET value = to_jsonb(v_next::bigint),
                   version = nextval('queen.kv_versions'), expires_at = v_expires,
                   updated_at = v_now
             WHERE k.ns = p_ns AND k.key = p_key
             RETURNING v_now, true, k.value::text, k.version, k.expires_at, k.updated_at;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT v_now, true, i.value, i.version, i.expires_at, i.updated_at
          FROM queen.kv_insert_v1(p_ns, p_key, to_jsonb(v_next::bigint), v_expires, v_now) i;
        IF FOUND THEN
            RETURN;
        END IF;
        -- A concurrent insert won: read its row and decide again.
    END LOOP;
END
$$;
