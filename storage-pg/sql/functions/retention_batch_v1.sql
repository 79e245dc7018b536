-- One batch of a queue's retention pass (the rules: core/src/storage/retention.rs). Takes up to
-- p_limit partitions whose oldest segment is older than the pass's later cutoff, after the mark
-- (p_after_at, p_after_id) in (oldest_at, id) order (an index range: never a scan of the queue's
-- partitions), and removes from each the segments the rules allow, with the transactionId rows
-- of their messages and, for expired segments, their dead letters.
-- Each partition row is locked FOR NO KEY UPDATE SKIP LOCKED: a partition a push holds is left
-- for the next cycle, pushes to a cleared one wait for the batch to commit, and pops (which take
-- at most FOR KEY SHARE on it) never wait. Under the lock, oldest_at is recomputed exactly.
-- p_eviction_only: the eviction pass, maxWaitTimeSeconds alone.
CREATE OR REPLACE FUNCTION queen.retention_batch_v1(
    p_queue text, p_eviction_only boolean, p_after_at timestamptz, p_after_id uuid, p_limit integer
) RETURNS TABLE (
    o_partitions integer, o_segments bigint, o_messages bigint, o_txids bigint,
    o_dead_letters bigint, o_next_at timestamptz, o_next_id uuid
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q record;
    p record;
    v_now timestamptz := queen.now();
    v_retention boolean;
    v_expire timestamptz;
    v_completed timestamptz;
    v_scan timestamptz;
    v_floor bigint;
    v_all_held boolean;
    v_held_from timestamptz;
    v_done_at timestamptz;
    v_visited integer := 0;
    v_segments bigint := 0;
    v_messages bigint := 0;
    v_txids bigint := 0;
    v_dlq bigint := 0;
    v_n bigint;
    v_stop bigint;
    v_bases bigint[];
    v_ends bigint[];
    v_counts integer[];
    v_expired bigint[];
    v_last_at timestamptz;
    v_last_id uuid;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 0, 0::bigint, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::uuid;
        RETURN;
    END IF;
    v_retention := q.retention_enabled AND NOT p_eviction_only;
    IF v_retention AND q.retention_seconds > 0 THEN
        v_expire := v_now - make_interval(secs => q.retention_seconds);
    END IF;
    IF q.max_wait_time_seconds > 0 THEN
        v_expire := GREATEST(v_expire, v_now - make_interval(secs => q.max_wait_time_seconds));
    END IF;
    IF v_retention AND q.completed_retention_seconds > 0 THEN
        v_completed := v_now - make_interval(secs => q.completed_retention_seconds);
    END IF;
    v_scan := GREATEST(v_expire, v_completed);
    IF v_scan IS NULL THEN
        RETURN QUERY SELECT 0, 0::bigint, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::uuid;
        RETURN;
    END IF;

    FOR p IN
        SELECT lp.id, lp.oldest_at
          FROM queen.log_partitions lp
         WHERE lp.queue_id = q.id AND lp.oldest_at < v_scan
           AND (p_after_id IS NULL OR (lp.oldest_at, lp.id) > (p_after_at, p_after_id))
         ORDER BY lp.oldest_at, lp.id
         LIMIT p_limit
    LOOP
        v_visited := v_visited + 1;
        v_last_at := p.oldest_at;
        v_last_id := p.id;
        PERFORM 1 FROM queen.log_partitions lp WHERE lp.id = p.id FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;

        -- Completed retention's floor: the slowest cursor row, and the groups with a record on
        -- the queue but no row here (they hold back what they will read: from their
        -- subscription timestamp; everything without one, and always for queue mode).
        v_floor := -1;
        v_done_at := NULL;
        IF v_completed IS NOT NULL THEN
            SELECT COALESCE(min(c.committed), -1) INTO v_floor
              FROM queen.log_consumers c WHERE c.partition_id = p.id;
            SELECT COALESCE(bool_or(m.subscription_timestamp IS NULL OR m.consumer_group = '__QUEUE_MODE__'), false),
                   min(m.subscription_timestamp)
              INTO v_all_held, v_held_from
              FROM queen.consumer_groups_metadata m
             WHERE m.queue_name = p_queue
               AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                WHERE c.partition_id = p.id AND c.consumer_group = m.consumer_group);
            IF NOT v_all_held THEN
                v_done_at := LEAST(v_completed, v_held_from);
            END IF;
        END IF;

        -- The removable segments are a prefix but for the ones a dead letter pins (created_at
        -- and end_offset both grow with base_offset): find its end with a walk over the prefix
        -- alone, so a partition pinned by a lagging group costs one index step, not its backlog.
        SELECT s.base_offset INTO v_stop
          FROM queen.log_segments s
         WHERE s.partition_id = p.id
           AND (v_expire IS NULL OR s.created_at >= v_expire)
           AND (v_done_at IS NULL OR s.created_at >= v_done_at OR s.end_offset > v_floor)
         ORDER BY s.base_offset
         LIMIT 1;
        WITH gone AS (
            DELETE FROM queen.log_segments s
             WHERE s.partition_id = p.id
               AND (v_stop IS NULL OR s.base_offset < v_stop)
               AND (s.created_at < v_expire
                    OR (s.created_at < v_done_at AND s.end_offset <= v_floor
                        AND NOT EXISTS (SELECT 1 FROM queen.dead_letters d
                                         WHERE d.partition_id = p.id
                                           AND d.msg_offset BETWEEN s.base_offset AND s.end_offset)))
            RETURNING s.base_offset, s.end_offset, s.msg_count, s.created_at < v_expire AS expired)
        SELECT array_agg(g.base_offset), array_agg(g.end_offset), array_agg(g.msg_count),
               array_agg(g.base_offset) FILTER (WHERE g.expired)
          INTO v_bases, v_ends, v_counts, v_expired
          FROM gone g;
        CONTINUE WHEN v_bases IS NULL;

        v_segments := v_segments + cardinality(v_bases);
        v_messages := v_messages + (SELECT sum(c) FROM unnest(v_counts) c);
        DELETE FROM queen.log_txids t
         WHERE t.partition_id = p.id
           AND EXISTS (SELECT 1 FROM unnest(v_bases, v_ends) r (b, e) WHERE t.msg_offset BETWEEN r.b AND r.e);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_txids := v_txids + v_n;
        IF v_expired IS NOT NULL THEN
            DELETE FROM queen.dead_letters d
             WHERE d.partition_id = p.id
               AND EXISTS (SELECT 1 FROM unnest(v_bases, v_ends) r (b, e)
                            WHERE r.b = ANY (v_expired) AND d.msg_offset BETWEEN r.b AND r.e);
            GET DIAGNOSTICS v_n = ROW_COUNT;
            v_dlq := v_dlq + v_n;
        END IF;
        UPDATE queen.log_partitions lp
           SET oldest_at = (SELECT s.created_at FROM queen.log_segments s
                             WHERE s.partition_id = p.id ORDER BY s.base_offset LIMIT 1)
         WHERE lp.id = p.id;
    END LOOP;

    RETURN QUERY SELECT v_visited, v_segments, v_messages, v_txids, v_dlq,
        CASE WHEN v_visited = p_limit THEN v_last_at END,
        CASE WHEN v_visited = p_limit THEN v_last_id END;
END
$$;
