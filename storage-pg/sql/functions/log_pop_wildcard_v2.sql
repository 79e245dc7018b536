-- The wildcard scan: QUEEN_HOTLIST=0, and the first-ever pop of every (queue, group), which
-- carries the group-first-contact bulk seed.
-- Sections, in order: the queue's partition count; group first contact (the
-- seeder's election and, for a small queue, every cursor seeded); the candidate scan (recently
-- written partitions in random order, or a window from a random id); log_pop_v2 over the
-- candidates while budgets last; the empty-scan watermark.
CREATE OR REPLACE FUNCTION queen.log_pop_wildcard_v2(
    p_queue text, p_group text, p_worker uuid, p_batch integer, p_max_partitions integer,
    p_auto_ack boolean, p_lease_seconds integer,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_conflation boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queen.queues;
    v_now timestamptz := queen.now();
    v_watermark timestamptz;
    v_checked timestamptz;
    v_has_wm boolean;
    v_count integer;
    v_cap integer;
    v_floor timestamptz;
    v_recent integer;
    v_start uuid;
    v_names text[];
    v_pids uuid[];
    v_seed_pids uuid[];
    v_inserted integer;
    v_sub_ts timestamptz;
    v_claims integer := 0;
    v_pending boolean;
    r record;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- The queue's partition count up to 128: the seed's rule and the candidate cap's.
    SELECT count(*) INTO v_count
      FROM (SELECT 1 FROM queen.log_partitions p WHERE p.queue_id = q.id LIMIT 128) x;

    -- Group first contact: one insert into consumer_groups_metadata records the subscription and
    -- elects the seeder (its election is a try-lock, so no contender waits). A small queue (at
    -- most 64 partitions, queen_core::claim::FIRST_CONTACT_SEED_CAP) has every cursor seeded by
    -- it, set-based: there many fresh consumers collide on few partitions, and lazy
    -- per-partition creation convoyed (each waited on another's pending insert, in chains). A
    -- larger queue's cursors are all made lazily, at their first claim, by the same rule
    -- (seed_cursor_v1 reads the subscription recorded here) and under the same try-locks, which
    -- never wait: its consumers' random windows rarely meet, and seeding 64 of them (the first
    -- ids, not this pop's candidates) cost its first contact 1.6 of 2.9 ms at 1M partitions.
    -- Seeding more cost more: every lock is a slot of PostgreSQL's shared lock table until
    -- commit (a queue of 100k partitions ran it out), and every row 20-40 us.
    IF NOT EXISTS (SELECT 1 FROM queen.consumer_groups_metadata m
                    WHERE m.queue_name = p_queue AND m.consumer_group = p_group)
       AND pg_try_advisory_xact_lock(hashtextextended(q.id::text || '/' || p_group, 43)) THEN
        INSERT INTO queen.consumer_groups_metadata
               (queue_name, consumer_group, subscription_timestamp, created_at, conflation)
        VALUES (p_queue, p_group,
                CASE WHEN p_sub_from IS NOT NULL THEN p_sub_from
                     WHEN p_sub_now OR p_sub_mode = 'new' THEN v_now END,
                v_now, p_conflation)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_inserted = ROW_COUNT;
        IF v_inserted = 1 AND v_count <= 64 THEN
            -- Locks first, in their own statement; rows another pop is creating are left to it.
            SELECT array_agg(x.id) INTO v_seed_pids
              FROM (SELECT p.id
                      FROM queen.log_partitions p
                     WHERE p.queue_id = q.id
                       AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                        WHERE c.partition_id = p.id AND c.consumer_group = p_group)
                     LIMIT 64) x
             WHERE pg_try_advisory_xact_lock(hashtextextended(x.id::text || '/' || p_group, 42));
            -- Then the insert, under a snapshot taken after every lock: it cannot conflict with
            -- a row in flight. With no subscription timestamp in the record just written,
            -- seed_cursor_v1 answers -1 for every partition: said here directly, which spares
            -- 64 function calls: 3 of the 8-11 ms of a first contact at 1M partitions.
            SELECT m.subscription_timestamp INTO v_sub_ts
              FROM queen.consumer_groups_metadata m
             WHERE m.queue_name = p_queue AND m.consumer_group = p_group;
            INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
            SELECT pid, p_group,
                   CASE WHEN v_sub_ts IS NULL THEN -1
                        ELSE queen.seed_cursor_v1(pid, p_queue, p_group, p_sub_mode, p_sub_from, p_sub_now)
                   END
              FROM unnest(COALESCE(v_seed_pids, '{}')) AS pid
             WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                WHERE c.partition_id = pid AND c.consumer_group = p_group)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;

    -- The candidate scan. The write watermark keeps a caught-up consumer from scanning the whole
    -- partition set (two minutes of slack absorb the one-second quantization of last_write_at);
    -- the filter is coarse (log_pop_v2 re-verifies under the row lock); more candidates than
    -- requested are fetched because some will be claimed concurrently or turn out empty.
    -- Consumers are spread instead of convoyed onto the lowest name in one of two ways:
    -- * few partitions written since the watermark (a caught-up group): those, read through the
    --   (queue_id, last_write_at) index, in random order;
    -- * otherwise a window: the first v_cap candidates in id order from a random id, wrapping
    --   once. Ids are random, so the window's start is a uniformly random partition, and the scan
    --   reads about as many rows as it returns. Sorting every pending partition by random() cost
    --   a full pass per pop: 0.01x of the 100-partition rate at 100k partitions.
    SELECT w.watermark, w.last_checked, true INTO v_watermark, v_checked, v_has_wm
      FROM queen.log_watermarks w
     WHERE w.queue_id = q.id AND w.consumer_group = p_group;
    v_floor := COALESCE(v_watermark, '-infinity'::timestamptz) - interval '2 minutes';
    -- queen_core::claim::wildcard_candidate_cap.
    v_cap := LEAST(CASE WHEN v_count >= 128 THEN 512 ELSE LEAST(GREATEST(v_count * 4, 64), 512) END,
                   GREATEST(p_max_partitions * 16, 64));
    IF v_floor > '-infinity'::timestamptz THEN
        SELECT count(*) INTO v_recent
          FROM (SELECT 1 FROM queen.log_partitions p
                 WHERE p.queue_id = q.id AND p.last_write_at >= v_floor
                 LIMIT v_cap * 4) x;
    END IF;
    IF v_recent IS NOT NULL AND v_recent < v_cap * 4 THEN
        SELECT array_agg(c.name), array_agg(c.id) INTO v_names, v_pids
          FROM (SELECT p.id, p.name
                  FROM queen.log_partitions p
                  LEFT JOIN queen.log_consumers c
                    ON c.partition_id = p.id AND c.consumer_group = p_group
                 WHERE p.queue_id = q.id
                   AND p.last_write_at >= v_floor
                   AND (c.partition_id IS NULL OR p.last_offset > c.committed)
                   AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
                 ORDER BY random()
                 LIMIT v_cap) c;
    ELSE
        v_start := gen_random_uuid();
        SELECT array_agg(w.name), array_agg(w.id) INTO v_names, v_pids
          FROM ((SELECT p.id, p.name
                   FROM queen.log_partitions p
                   LEFT JOIN queen.log_consumers c
                     ON c.partition_id = p.id AND c.consumer_group = p_group
                  WHERE p.queue_id = q.id AND p.id >= v_start
                    AND p.last_write_at >= v_floor
                    AND (c.partition_id IS NULL OR p.last_offset > c.committed)
                    AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
                  ORDER BY p.id
                  LIMIT v_cap)
                UNION ALL
                (SELECT p.id, p.name
                   FROM queen.log_partitions p
                   LEFT JOIN queen.log_consumers c
                     ON c.partition_id = p.id AND c.consumer_group = p_group
                  WHERE p.queue_id = q.id AND p.id < v_start
                    AND p.last_write_at >= v_floor
                    AND (c.partition_id IS NULL OR p.last_offset > c.committed)
                    AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
                  ORDER BY p.id
                  LIMIT v_cap)
                LIMIT v_cap) w;
    END IF;

    FOR r IN SELECT * FROM queen.log_pop_loop_v2(
        q, p_group, COALESCE(v_names, '{}'), COALESCE(v_pids, '{}'), p_worker, p_batch, p_max_partitions,
        p_auto_ack, p_lease_seconds, false, p_sub_mode, p_sub_from, p_sub_now, v_now, p_conflation)
    LOOP
        IF r.o_kind IN ('took', 'took_all') THEN
            v_claims := v_claims + 1;
        END IF;
        o_partition := r.o_partition; o_partition_id := r.o_partition_id; o_kind := r.o_kind;
        o_until := r.o_until; o_first := r.o_first; o_last := r.o_last; o_attempt := r.o_attempt;
        o_lease_exp := r.o_lease_exp; o_base := r.o_base; o_start := r.o_start; o_take := r.o_take;
        o_count := r.o_count; o_created := r.o_created; o_blob := r.o_blob;
        RETURN NEXT;
    END LOOP;

    -- The empty-scan watermark: not advanced blindly (a partition may have been skipped only
    -- because someone held its lease). At most every 30 s, re-check for pending data ignoring the
    -- lease filter; advance only if the queue is genuinely empty for this group, otherwise record
    -- the check and keep the floor, so a lease-held backlog is never stranded.
    IF v_claims = 0 AND (v_checked IS NULL OR v_now >= v_checked + interval '30 seconds')
       AND pg_try_advisory_xact_lock(hashtextextended(q.id::text || '/' || p_group, 44)) THEN
        SELECT EXISTS (
            SELECT 1 FROM queen.log_partitions p
              LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
             WHERE p.queue_id = q.id
               AND ((c.partition_id IS NULL AND p.last_offset >= 0) OR p.last_offset > c.committed))
          INTO v_pending;
        INSERT INTO queen.log_watermarks (queue_id, consumer_group, watermark, last_checked)
        VALUES (q.id, p_group,
                CASE WHEN v_pending THEN COALESCE(v_watermark, '-infinity'::timestamptz) ELSE v_now END,
                v_now)
        ON CONFLICT (queue_id, consumer_group)
        DO UPDATE SET watermark = EXCLUDED.watermark, last_checked = EXCLUDED.last_checked;
    END IF;
END
$$;
