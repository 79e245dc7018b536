-- Runs log_pop_v2 over named candidates while the budgets last: the loop shared by the list,
-- specific and wildcard procedures. p_pids may carry known ids (NULL = resolve by name).
-- First the group's conflation policy (queen_core::claim::policy_step): the stored one, or, for
-- an unregistered group whose pop asks for conflation, a registration as conflating. The stored
-- policy is answered as a first row of kind 'policy' (o_attempt 1 = conflating, 0 = not); none
-- for an unregistered group. A registration whose try-lock another pop holds claims nothing: its
-- candidates are 'busy' until that registration commits.
CREATE OR REPLACE FUNCTION queen.log_pop_loop_v2(
    p_queue queen.queues, p_group text, p_names text[], p_pids uuid[], p_worker uuid,
    p_batch integer, p_max_partitions integer, p_auto_ack boolean, p_lease_seconds integer,
    p_skip_window boolean, p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_now timestamptz,
    p_conflation boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_left integer := p_batch;
    v_claims integer := 0;
    v_lease integer := COALESCE(NULLIF(p_lease_seconds, 0), NULLIF(p_queue.lease_time, 0), 60);
    v_pid uuid;
    v_stored boolean;
    v_unknown boolean := false;
    i integer;
    r record;
BEGIN
    IF p_queue.id IS NOT NULL AND p_group <> '__QUEUE_MODE__' THEN
        SELECT m.conflation INTO v_stored
          FROM queen.consumer_groups_metadata m
         WHERE m.queue_name = p_queue.name AND m.consumer_group = p_group;
        IF NOT FOUND AND p_conflation THEN
            -- The first-contact election's lock (log_pop_wildcard_v2): no registration waits.
            IF pg_try_advisory_xact_lock(hashtextextended(p_queue.id::text || '/' || p_group, 43)) THEN
                INSERT INTO queen.consumer_groups_metadata
                       (queue_name, consumer_group, subscription_timestamp, created_at, conflation)
                VALUES (p_queue.name, p_group,
                        CASE WHEN p_sub_from IS NOT NULL THEN p_sub_from
                             WHEN p_sub_now OR p_sub_mode = 'new' THEN p_now END,
                        p_now, true)
                ON CONFLICT DO NOTHING;
                SELECT m.conflation INTO v_stored
                  FROM queen.consumer_groups_metadata m
                 WHERE m.queue_name = p_queue.name AND m.consumer_group = p_group;
            ELSE
                v_unknown := true;
            END IF;
        END IF;
    END IF;
    IF v_stored IS NOT NULL THEN
        o_kind := 'policy'; o_attempt := CASE WHEN v_stored THEN 1 ELSE 0 END;
        RETURN NEXT;
        o_attempt := NULL;
    END IF;
    FOR i IN 1 .. COALESCE(array_length(p_names, 1), 0) LOOP
        o_partition := p_names[i];
        o_partition_id := NULL; o_until := NULL; o_first := NULL; o_last := NULL; o_attempt := NULL;
        o_lease_exp := NULL; o_base := NULL; o_start := NULL; o_take := NULL; o_count := NULL;
        o_created := NULL; o_blob := NULL;
        IF v_unknown THEN
            o_kind := 'busy';
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF v_left <= 0 OR v_claims >= GREATEST(p_max_partitions, 1) THEN
            o_kind := 'not_evaluated';
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_pid := p_pids[i];
        IF v_pid IS NULL THEN
            SELECT p.id INTO v_pid FROM queen.log_partitions p
             WHERE p.queue_id = p_queue.id AND p.name = p_names[i];
            IF NOT FOUND THEN
                o_kind := 'missing';
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        o_partition_id := v_pid;
        FOR r IN
            SELECT * FROM queen.log_pop_v2(
                v_pid, p_queue.name, p_group, p_worker, v_left, p_auto_ack, v_lease,
                p_queue.delayed_processing, p_queue.window_buffer, p_skip_window,
                p_sub_mode, p_sub_from, p_sub_now, p_now, p_queue.ttl, COALESCE(v_stored, false))
        LOOP
            o_kind := r.o_kind; o_until := r.o_until; o_first := r.o_first; o_last := r.o_last;
            o_attempt := r.o_attempt; o_lease_exp := r.o_lease_exp; o_base := r.o_base;
            o_start := r.o_start; o_take := r.o_take; o_count := r.o_count;
            o_created := r.o_created; o_blob := r.o_blob;
            RETURN NEXT;
            IF r.o_kind IN ('took', 'took_all') THEN
                v_left := v_left - (r.o_last - r.o_first + 1)::integer;
                v_claims := v_claims + 1;
            END IF;
        END LOOP;
    END LOOP;
END
$$;
