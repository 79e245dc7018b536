-- One batch of a queue's retention pass (the rules: core/src/storage/retention.rs), set-based:
-- a handful of statements per batch, whatever its size.
-- 1. Candidates: up to p_limit partitions whose oldest segment is older than the pass's later
--    cutoff, after the mark (p_after_at, p_after_id) in (oldest_at, id) order: an index range,
--    never a scan of the queue's partitions. Each is locked FOR NO KEY UPDATE SKIP LOCKED: a
--    partition a push holds is left for the next cycle, pushes to a locked one wait for the
--    batch to commit, and pops (which take at most FOR KEY SHARE on it) never wait.
-- 2. Completed retention's floor per partition: the slowest cursor row, and the groups with a
--    record on the queue and a cursor row elsewhere on it but not there (they hold back what
--    they will read: from their subscription timestamp; everything without one, and always for
--    queue mode).
-- 3. The removal: per partition, the end of the removable prefix is found by an index walk over
--    the prefix alone (created_at and end_offset both grow with base_offset; only segments a
--    dead letter pins are skipped inside it), so a partition pinned by a lagging group costs one
--    index step, not its backlog. The segments go with their transactionId rows, expired ones
--    with their dead letters, and oldest_at is recomputed under the partition lock.
-- p_eviction_only: the eviction pass, maxWaitTimeSeconds alone.
CREATE OR REPLACE FUNCTION queen.retention_batch_v1(
    p_queue text, p_eviction_only boolean, p_after_at timestamptz, p_after_id uuid, p_limit integer
) RETURNS TABLE (
    o_partitions integer, o_segments bigint, o_messages bigint, o_txids bigint,
    o_dead_letters bigint, o_next_at timestamptz, o_next_id uuid
)
LANGUAGE plpgsql VOLATILE
-- Every join here is a batch of partitions against a large table by partition id: nested loops
-- over the primary keys. A hash or merge join is what the planner picks for an unnest or a CTE
-- of unknown size, and it read the whole of a million-row log_segments and log_txids on every
-- batch (docs/benchmarks.md), holding the batch's partition locks meanwhile.
-- The estimates of those unknown sizes are huge, so the planner also JIT-compiled the statement:
-- 630 ms of a 700 ms batch. The work itself is milliseconds.
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    q record;
    m record;
    v_reads boolean;
    v_walked bigint;
    v_now timestamptz := queen.now();
    v_retention boolean;
    v_expire timestamptz;
    v_completed timestamptz;
    v_scan timestamptz;
    v_pids uuid[];
    v_oldest timestamptz[];
    v_floor bigint[];
    v_done_at timestamptz[];
    v_groups text[];
    v_group_from timestamptz[];
    v_visited integer;
    v_segments bigint;
    v_messages bigint;
    v_txids bigint;
    v_dlq bigint;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF FOUND THEN
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
    END IF;
    IF v_scan IS NULL THEN
        RETURN QUERY SELECT 0, 0::bigint, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::uuid;
        RETURN;
    END IF;

    SELECT array_agg(c.id ORDER BY c.oldest_at, c.id), array_agg(c.oldest_at ORDER BY c.oldest_at, c.id)
      INTO v_pids, v_oldest
      FROM (SELECT lp.id, lp.oldest_at
              FROM queen.log_partitions lp
             WHERE lp.queue_id = q.id AND lp.oldest_at < v_scan
               AND (p_after_id IS NULL OR (lp.oldest_at, lp.id) > (p_after_at, p_after_id))
             ORDER BY lp.oldest_at, lp.id
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) c;
    v_visited := COALESCE(cardinality(v_pids), 0);
    IF v_visited = 0 THEN
        RETURN QUERY SELECT 0, 0::bigint, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::uuid;
        RETURN;
    END IF;

    IF v_completed IS NOT NULL THEN
        -- The groups that read the queue: a subscription record and a cursor row somewhere on
        -- it (a record without any is a deleted group's, and holds nothing back). Asked from the
        -- cheap side first, per group, because the batch holds its partitions' locks meanwhile:
        -- as one semi-join its plan walked every cursor of the group or every partition of the
        -- queue, 17.7 ms a batch (max 42; 158 ms in another plan) at 100k partitions with a
        -- second queue read by the same group (pg_stat_statements; docs/benchmarks.md).
        FOR m IN SELECT g.consumer_group, g.subscription_timestamp
                   FROM queen.consumer_groups_metadata g
                  WHERE g.queue_name = p_queue
                  ORDER BY g.consumer_group LOOP
            -- Each step drives from its named side through a LATERAL ... LIMIT 1, which the planner
            -- can neither flatten nor turn around (as a join, step 1 walked the group's 200k
            -- cursors: 158 ms a batch).
            -- 1. A cursor on one of this batch's partitions: a primary-key probe each.
            v_reads := EXISTS (SELECT 1 FROM unnest(v_pids) AS u (pid)
                                CROSS JOIN LATERAL (
                                      SELECT 1 FROM queen.log_consumers c
                                       WHERE c.partition_id = u.pid
                                         AND c.consumer_group = m.consumer_group
                                       LIMIT 1) c);
            IF NOT v_reads THEN
                -- 2. The group's cursors anywhere, a bounded walk: most groups have few.
                SELECT count(*), COALESCE(bool_or(lp.queue_id = q.id), false)
                  INTO v_walked, v_reads
                  FROM (SELECT c.partition_id FROM queen.log_consumers c
                         WHERE c.consumer_group = m.consumer_group
                         LIMIT 1000) c
                 CROSS JOIN LATERAL (SELECT p.queue_id FROM queen.log_partitions p
                                      WHERE p.id = c.partition_id LIMIT 1) lp;
                -- 3. Both sides large: the queue's partitions, each a probe of the group's cursor.
                IF NOT v_reads AND v_walked >= 1000 THEN
                    v_reads := EXISTS (SELECT 1 FROM queen.log_partitions lp
                                        CROSS JOIN LATERAL (
                                              SELECT 1 FROM queen.log_consumers c
                                               WHERE c.partition_id = lp.id
                                                 AND c.consumer_group = m.consumer_group
                                               LIMIT 1) c
                                        WHERE lp.queue_id = q.id);
                END IF;
            END IF;
            IF v_reads THEN
                v_groups := v_groups || m.consumer_group;
                v_group_from := v_group_from || CASE WHEN m.consumer_group = '__QUEUE_MODE__'
                                                     THEN NULL::timestamptz
                                                     ELSE m.subscription_timestamp END;
            END IF;
        END LOOP;
        SELECT array_agg(COALESCE(f.floor, -1) ORDER BY f.ord),
               array_agg(CASE WHEN NOT COALESCE(h.all_held, false)
                              THEN LEAST(v_completed, h.held_from) END ORDER BY f.ord)
          INTO v_floor, v_done_at
          FROM (SELECT u.pid, u.ord,
                       (SELECT min(c.committed) FROM queen.log_consumers c WHERE c.partition_id = u.pid) AS floor
                  FROM unnest(v_pids) WITH ORDINALITY AS u (pid, ord)) f
          LEFT JOIN LATERAL (
                SELECT bool_or(g.reads_from IS NULL) AS all_held, min(g.reads_from) AS held_from
                  FROM unnest(v_groups, v_group_from) AS g (name, reads_from)
                 WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                    WHERE c.partition_id = f.pid AND c.consumer_group = g.name)) h ON true;
    END IF;

    WITH part AS (
        SELECT u.pid, u.floor, u.done_at
          FROM unnest(v_pids, COALESCE(v_floor, array_fill(-1::bigint, ARRAY[v_visited])),
                      COALESCE(v_done_at, array_fill(NULL::timestamptz, ARRAY[v_visited])))
               AS u (pid, floor, done_at)),
    bound AS (
        SELECT p.pid, p.floor, p.done_at,
               (SELECT s.base_offset
                  FROM queen.log_segments s
                 WHERE s.partition_id = p.pid
                   AND (v_expire IS NULL OR s.created_at >= v_expire)
                   AND (p.done_at IS NULL OR s.created_at >= p.done_at OR s.end_offset > p.floor)
                 ORDER BY s.base_offset
                 LIMIT 1) AS stop
          FROM part p),
    -- The prefix is read by the primary key, in order, behind a fence (OFFSET 0) that keeps the
    -- cutoffs out of its scan: with them, the planner walked (created_at, partition_id, ...)
    -- from the start up to the cutoff, every old segment of every partition of every queue, for
    -- each partition of the batch (34 ms a partition on a database that holds other queues'
    -- history, with the batch's partition locks held and pushes to them waiting).
    victims AS (
        SELECT b.pid, v.base_offset
          FROM bound b
         CROSS JOIN LATERAL (
               SELECT x.base_offset, x.end_offset, x.created_at
                 FROM queen.log_segments x
                WHERE x.partition_id = b.pid
                  AND x.base_offset < COALESCE(b.stop, 9223372036854775807)
                ORDER BY x.base_offset
               OFFSET 0) v
         WHERE v.created_at < v_expire
            OR (v.created_at < b.done_at AND v.end_offset <= b.floor
                AND NOT EXISTS (SELECT 1 FROM queen.dead_letters d
                                 WHERE d.partition_id = b.pid
                                   AND d.msg_offset BETWEEN v.base_offset AND v.end_offset))),
    gone AS (
        DELETE FROM queen.log_segments s
         USING victims v
         WHERE s.partition_id = v.pid AND s.base_offset = v.base_offset
        RETURNING s.partition_id, s.base_offset, s.end_offset, s.msg_count,
                  COALESCE(s.created_at < v_expire, false) AS expired),
    gone_by_partition AS (
        SELECT g.partition_id, array_agg(g.base_offset) AS bases, array_agg(g.end_offset) AS ends,
               min(g.base_offset) AS first, max(g.end_offset) AS last
          FROM gone g GROUP BY g.partition_id),
    -- Once per partition, not per removed segment: the transactionId rows are keyed by
    -- (partition, transactionId), so each lookup reads the partition's rows.
    txids AS (
        DELETE FROM queen.log_txids t
         USING gone_by_partition g
         WHERE t.partition_id = g.partition_id AND t.msg_offset BETWEEN g.first AND g.last
           AND EXISTS (SELECT 1 FROM unnest(g.bases, g.ends) r (b, e)
                        WHERE t.msg_offset BETWEEN r.b AND r.e)
        RETURNING 1),
    traces AS (
        DELETE FROM queen.message_traces tr
         USING gone g
         WHERE tr.partition_id = g.partition_id
           AND tr.msg_offset BETWEEN g.base_offset AND g.end_offset
        RETURNING 1),
    letters AS (
        DELETE FROM queen.dead_letters d
         USING gone g
         WHERE g.expired AND d.partition_id = g.partition_id
           AND d.msg_offset BETWEEN g.base_offset AND g.end_offset
        RETURNING 1),
    heads AS (
        -- The statement still sees the deleted rows: the new oldest is the first one not gone.
        -- (A data-modifying WITH runs to completion whether or not it is read.)
        UPDATE queen.log_partitions lp
           SET oldest_at = (SELECT s.created_at FROM queen.log_segments s
                             WHERE s.partition_id = lp.id AND s.base_offset <> ALL (g.bases)
                             ORDER BY s.base_offset LIMIT 1)
          FROM gone_by_partition g
         WHERE lp.id = g.partition_id
        RETURNING 1)
    SELECT (SELECT count(*) FROM gone), (SELECT COALESCE(sum(g.msg_count), 0) FROM gone g),
           (SELECT count(*) FROM txids), (SELECT count(*) FROM letters)
      INTO v_segments, v_messages, v_txids, v_dlq;

    RETURN QUERY SELECT v_visited, v_segments, v_messages, v_txids, v_dlq,
        CASE WHEN v_visited = p_limit THEN v_oldest[v_visited] END,
        CASE WHEN v_visited = p_limit THEN v_pids[v_visited] END;
END
$$;
