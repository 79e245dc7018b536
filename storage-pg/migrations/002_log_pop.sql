-- The pop: which offsets may this group take from this partition right now, under a row lock.
-- Every path here is non-blocking: SKIP LOCKED, advisory *try* locks, and inserts that cannot
-- conflict with an in-flight row (see log_pop_v1 step 3). The broker's ring decides which
-- partitions to ask about; these functions decide what may be taken.

-- Step 3: where a never-seen (partition, group) cursor starts. The durable subscription record
-- first, then the pop-carried intent, then -1. __QUEUE_MODE__ never skips backlog.
CREATE OR REPLACE FUNCTION queen.seed_cursor_v1(
    p_pid uuid, p_queue_name text, p_group text,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_last bigint;
    v_ts timestamptz;
    v_base bigint;
BEGIN
    SELECT p.last_offset INTO v_last FROM queen.log_partitions p WHERE p.id = p_pid;
    IF p_group = '__QUEUE_MODE__' THEN
        RETURN -1;
    END IF;
    SELECT m.subscription_timestamp INTO v_ts
      FROM queen.consumer_groups_metadata m
     WHERE m.queue_name = p_queue_name AND m.consumer_group = p_group;
    IF FOUND THEN
        IF v_ts IS NULL THEN
            RETURN -1;
        END IF;
    ELSIF p_sub_from IS NOT NULL THEN
        v_ts := p_sub_from;
    ELSIF p_sub_now OR p_sub_mode = 'new' THEN
        RETURN v_last;
    ELSE
        RETURN -1;
    END IF;
    -- Just before the first segment at or after the timestamp: a forward walk from the
    -- retention start (created_at is monotone in base_offset), never from offset 0.
    SELECT s.base_offset INTO v_base
      FROM queen.log_segments s
     WHERE s.partition_id = p_pid AND s.created_at >= v_ts
     ORDER BY s.base_offset
     LIMIT 1;
    RETURN COALESCE(v_base - 1, v_last);
END
$$;

-- One partition. Emits one 'row' per segment slice, then one summary row whose o_kind is the
-- verdict: took | empty | leased | busy | deferred.
CREATE OR REPLACE FUNCTION queen.log_pop_v1(
    p_pid uuid, p_queue_name text, p_group text, p_worker uuid,
    p_budget integer, p_auto_ack boolean, p_lease_seconds integer,
    p_delayed integer, p_window integer, p_skip_window boolean,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_now timestamptz
) RETURNS TABLE (
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_committed bigint;
    v_live_until timestamptz;
    v_newest timestamptz;
    v_wanted bigint;
    v_left integer := p_budget;
    v_taken integer := 0;
    v_take integer;
    v_head record;
    v_seg record;
    v_first_invisible timestamptz;
    v_last_offset bigint;
    v_seed bigint;
    v_last bigint;
BEGIN
    -- Step 2, windowBuffer: a quiet-period debounce, one backward primary-key step to the
    -- newest segment. The ring path may bypass it: the broker's wheel then owns the hold.
    IF p_window > 0 AND NOT p_skip_window THEN
        SELECT s.created_at INTO v_newest
          FROM queen.log_segments s
         WHERE s.partition_id = p_pid
         ORDER BY s.base_offset DESC
         LIMIT 1;
        IF v_newest IS NOT NULL AND v_newest + make_interval(secs => p_window) > p_now THEN
            o_kind := 'deferred';
            o_until := v_newest + make_interval(secs => p_window);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    -- Step 4, the claim. SKIP LOCKED: another worker's live lease, or another pop mid-flight on
    -- this row, means this partition is skipped this cycle. No per-pop INSERT ... ON CONFLICT:
    -- that made concurrent pops wait on each other in cycles (deadlock storms).
    SELECT c.committed INTO v_committed
      FROM queen.log_consumers c
     WHERE c.partition_id = p_pid AND c.consumer_group = p_group
       AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < p_now)
       FOR UPDATE SKIP LOCKED;

    IF NOT FOUND THEN
        -- Re-probe without the lease filter: missing, or present but leased or locked?
        SELECT CASE WHEN c.worker_id IS NOT NULL AND c.lease_expires_at >= p_now THEN c.lease_expires_at END
          INTO v_live_until
          FROM queen.log_consumers c
         WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
        IF FOUND THEN
            o_kind := CASE WHEN v_live_until IS NOT NULL THEN 'leased' ELSE 'busy' END;
            o_until := v_live_until;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Missing: *try* the transaction-scoped advisory lock. Taking it would wait on another
        -- creator's whole transaction (a wildcard pop's lives for its candidate loop), and those
        -- waits chain into a livelock no deadlock detector breaks. A hash collision merely
        -- false-skips an unrelated partition for one cycle.
        IF NOT pg_try_advisory_xact_lock(hashtextextended(p_pid::text || '/' || p_group, 42)) THEN
            o_kind := 'busy';
            RETURN NEXT;
            RETURN;
        END IF;
        -- Step 3, seed the new cursor. NOT EXISTS runs under a snapshot taken after the lock:
        -- a row another pop created and committed since our re-probe is seen here, so the insert
        -- can never conflict with a row a third pop is updating (the unique check would wait on
        -- that updater). Only the lock holder creates the row, so nothing newer can appear.
        v_seed := queen.seed_cursor_v1(p_pid, p_queue_name, p_group, p_sub_mode, p_sub_from, p_sub_now);
        INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
        SELECT p_pid, p_group, v_seed
         WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                            WHERE c.partition_id = p_pid AND c.consumer_group = p_group)
        ON CONFLICT DO NOTHING;
        -- Re-claim.
        SELECT c.committed INTO v_committed
          FROM queen.log_consumers c
         WHERE c.partition_id = p_pid AND c.consumer_group = p_group
           AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < p_now)
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            o_kind := 'busy';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    -- Step 5, the head probe: one backward step for the greatest base_offset <= wanted, written as
    -- a bare LIMIT 1 with the covering test applied afterwards, so a miss never walks the head.
    v_wanted := v_committed + 1;
    SELECT s.base_offset, s.end_offset, s.msg_count, s.created_at, s.blob INTO v_head
      FROM queen.log_segments s
     WHERE s.partition_id = p_pid AND s.base_offset <= v_wanted
     ORDER BY s.base_offset DESC
     LIMIT 1;
    IF FOUND AND v_head.end_offset >= v_wanted THEN
        IF p_delayed > 0 AND v_head.created_at > p_now - make_interval(secs => p_delayed) THEN
            v_first_invisible := v_head.created_at;
        ELSE
            v_take := LEAST(v_head.end_offset - v_wanted + 1, v_left)::integer;
            o_kind := 'row'; o_base := v_head.base_offset; o_start := (v_wanted - v_head.base_offset)::integer;
            o_take := v_take; o_count := v_head.msg_count; o_created := v_head.created_at; o_blob := v_head.blob;
            RETURN NEXT;
            v_left := v_left - v_take;
            v_taken := v_taken + v_take;
        END IF;
    END IF;

    -- The forward scan is a cursor loop: leaving it at the budget stops the index walk, so a deep
    -- backlog costs only the rows delivered. delayedProcessing cuts a contiguous suffix (created_at
    -- is monotone), so the first invisible segment ends the scan.
    IF v_left > 0 AND v_first_invisible IS NULL THEN
        FOR v_seg IN
            SELECT s.base_offset, s.msg_count, s.created_at, s.blob
              FROM queen.log_segments s
             WHERE s.partition_id = p_pid AND s.base_offset > v_wanted
             ORDER BY s.base_offset
        LOOP
            IF p_delayed > 0 AND v_seg.created_at > p_now - make_interval(secs => p_delayed) THEN
                IF v_taken = 0 THEN
                    v_first_invisible := v_seg.created_at;
                END IF;
                EXIT;
            END IF;
            v_take := LEAST(v_seg.msg_count, v_left);
            o_kind := 'row'; o_base := v_seg.base_offset; o_start := 0; o_take := v_take;
            o_count := v_seg.msg_count; o_created := v_seg.created_at; o_blob := v_seg.blob;
            RETURN NEXT;
            v_left := v_left - v_take;
            v_taken := v_taken + v_take;
            EXIT WHEN v_left <= 0;
        END LOOP;
    END IF;
    o_base := NULL; o_start := NULL; o_take := NULL; o_count := NULL; o_created := NULL; o_blob := NULL;

    IF v_taken = 0 THEN
        IF v_first_invisible IS NOT NULL THEN
            o_kind := 'deferred';
            o_until := v_first_invisible + make_interval(secs => p_delayed);
            RETURN NEXT;
            RETURN;
        END IF;
        -- The empty-partition cursor seal: only when the partition holds no segments at all
        -- (retention removed them) and last_offset > committed. Deferred segments are segments,
        -- so they are never sealed past; a concurrent push lands above the snapshotted
        -- last_offset and stays pending. A cursor seal, not a claim: no lease field changes.
        IF NOT EXISTS (SELECT 1 FROM queen.log_segments s WHERE s.partition_id = p_pid) THEN
            SELECT p.last_offset INTO v_last_offset FROM queen.log_partitions p WHERE p.id = p_pid;
            IF v_last_offset > v_committed THEN
                UPDATE queen.log_consumers c SET committed = v_last_offset
                 WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
            END IF;
        END IF;
        o_kind := 'empty';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Step 6: autoAck commits inside the pop (at-most-once); otherwise lease (committed, last].
    v_last := v_wanted + v_taken - 1;
    o_kind := 'took'; o_first := v_wanted; o_last := v_last;
    IF p_auto_ack THEN
        UPDATE queen.log_consumers c
           SET committed = v_last, worker_id = NULL, lease_expires_at = NULL,
               lease_acquired_at = NULL, batch_end = NULL,
               total_consumed = c.total_consumed + v_taken
         WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
        o_attempt := 1;
        o_lease_exp := NULL;
    ELSE
        -- A batch starting where the previous delivery started is a redelivery (nack or expiry).
        UPDATE queen.log_consumers c
           SET worker_id = p_worker,
               lease_expires_at = p_now + make_interval(secs => p_lease_seconds),
               lease_acquired_at = p_now,
               batch_end = v_last,
               attempt_count = CASE WHEN c.attempt_offset IS NOT DISTINCT FROM v_wanted
                                    THEN c.attempt_count + 1 ELSE 1 END,
               attempt_offset = v_wanted
         WHERE c.partition_id = p_pid AND c.consumer_group = p_group
        RETURNING c.attempt_count, c.lease_expires_at INTO o_attempt, o_lease_exp;
    END IF;
    RETURN NEXT;
END
$$;

-- Runs log_pop_v1 over named candidates while the budgets last: the loop shared by the list,
-- specific and wildcard procedures. p_pids may carry known ids (NULL = resolve by name).
CREATE OR REPLACE FUNCTION queen.log_pop_loop_v1(
    p_queue queen.queues, p_group text, p_names text[], p_pids uuid[], p_worker uuid,
    p_batch integer, p_max_partitions integer, p_auto_ack boolean, p_lease_seconds integer,
    p_skip_window boolean, p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_now timestamptz
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
    i integer;
    r record;
BEGIN
    FOR i IN 1 .. COALESCE(array_length(p_names, 1), 0) LOOP
        o_partition := p_names[i];
        o_partition_id := NULL; o_until := NULL; o_first := NULL; o_last := NULL; o_attempt := NULL;
        o_lease_exp := NULL; o_base := NULL; o_start := NULL; o_take := NULL; o_count := NULL;
        o_created := NULL; o_blob := NULL;
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
            SELECT * FROM queen.log_pop_v1(
                v_pid, p_queue.name, p_group, p_worker, v_left, p_auto_ack, v_lease,
                p_queue.delayed_processing, p_queue.window_buffer, p_skip_window,
                p_sub_mode, p_sub_from, p_sub_now, p_now)
        LOOP
            o_kind := r.o_kind; o_until := r.o_until; o_first := r.o_first; o_last := r.o_last;
            o_attempt := r.o_attempt; o_lease_exp := r.o_lease_exp; o_base := r.o_base;
            o_start := r.o_start; o_take := r.o_take; o_count := r.o_count;
            o_created := r.o_created; o_blob := r.o_blob;
            RETURN NEXT;
            IF r.o_kind = 'took' THEN
                v_left := v_left - (r.o_last - r.o_first + 1)::integer;
                v_claims := v_claims + 1;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- log_pop_list_v1: candidate names from the broker's hot-list ring, one transaction.
CREATE OR REPLACE FUNCTION queen.log_pop_list_v1(
    p_queue text, p_group text, p_names text[], p_worker uuid, p_batch integer,
    p_max_partitions integer, p_auto_ack boolean, p_lease_seconds integer, p_skip_window boolean,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queen.queues;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT n, NULL::uuid, 'missing'::text, NULL::timestamptz, NULL::bigint, NULL::bigint,
            NULL::integer, NULL::timestamptz, NULL::bigint, NULL::integer, NULL::integer, NULL::integer,
            NULL::timestamptz, NULL::bytea
          FROM unnest(p_names) AS n;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM queen.log_pop_loop_v1(
        q, p_group, p_names, array_fill(NULL::uuid, ARRAY[COALESCE(array_length(p_names, 1), 0)]),
        p_worker, p_batch, p_max_partitions, p_auto_ack, p_lease_seconds, p_skip_window,
        p_sub_mode, p_sub_from, p_sub_now, queen.now());
END
$$;

-- One row of a pop answer, for buffering inside log_pop_specific_v1.
DO $$ BEGIN
    CREATE TYPE queen.log_pop_row_v1 AS (
        partition text, partition_id uuid, kind text, until_at timestamptz, first_offset bigint,
        last_offset bigint, attempt integer, lease_exp timestamptz, base_offset bigint,
        start_idx integer, take integer, msg_count integer, created_at timestamptz, blob bytea);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- log_pop_specific_v1: one named partition. A VOLATILE plpgsql function that runs the claim first
-- and resolves the reported partitionId afterwards, in a later command of the same function, whose
-- snapshot is at least as new as anything the claim saw. The previous shape resolved it in the
-- outer statement, under a snapshot taken before the claim: a pop racing the commit of the push
-- that created the partition delivered a leased batch whose messages carried partitionId "".
CREATE OR REPLACE FUNCTION queen.log_pop_specific_v1(
    p_queue text, p_partition text, p_group text, p_worker uuid, p_batch integer,
    p_auto_ack boolean, p_lease_seconds integer,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queen.queues;
    v_reported uuid;
    v_took boolean := false;
    r record;
    v_rows queen.log_pop_row_v1[] := '{}';
    v_row queen.log_pop_row_v1;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        o_partition := p_partition; o_kind := 'missing';
        RETURN NEXT;
        RETURN;
    END IF;
    FOR r IN SELECT * FROM queen.log_pop_loop_v1(
        q, p_group, ARRAY[p_partition], ARRAY[NULL::uuid], p_worker, p_batch, 1, p_auto_ack,
        p_lease_seconds, false, p_sub_mode, p_sub_from, p_sub_now, queen.now())
    LOOP
        v_took := v_took OR r.o_kind = 'took';
        v_rows := v_rows || ROW(r.o_partition, r.o_partition_id, r.o_kind, r.o_until, r.o_first, r.o_last,
            r.o_attempt, r.o_lease_exp, r.o_base, r.o_start, r.o_take, r.o_count, r.o_created, r.o_blob)::queen.log_pop_row_v1;
    END LOOP;
    IF v_took THEN
        SELECT p.id INTO v_reported FROM queen.log_partitions p
         WHERE p.queue_id = q.id AND p.name = p_partition;
    END IF;
    FOREACH v_row IN ARRAY v_rows LOOP
        o_partition := v_row.partition; o_partition_id := COALESCE(v_reported, v_row.partition_id);
        o_kind := v_row.kind; o_until := v_row.until_at; o_first := v_row.first_offset;
        o_last := v_row.last_offset; o_attempt := v_row.attempt; o_lease_exp := v_row.lease_exp;
        o_base := v_row.base_offset; o_start := v_row.start_idx; o_take := v_row.take;
        o_count := v_row.msg_count; o_created := v_row.created_at; o_blob := v_row.blob;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The wildcard scan: QUEEN_HOTLIST=0, and the first-ever pop of every (queue, group), which
-- carries the group-first-contact bulk seed.
CREATE OR REPLACE FUNCTION queen.log_pop_wildcard_v1(
    p_queue text, p_group text, p_worker uuid, p_batch integer, p_max_partitions integer,
    p_auto_ack boolean, p_lease_seconds integer,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
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
    v_names text[];
    v_pids uuid[];
    v_seed_pids uuid[];
    v_inserted integer;
    v_claims integer := 0;
    v_pending boolean;
    r record;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- Group-first-contact bulk seed. Without it, lazy per-partition creation convoys: many
    -- consumers of a fresh queue each wait on another's pending insert, in chains. One insert into
    -- consumer_groups_metadata elects the seeder (its election is a try-lock, so no contender
    -- waits), and the seeder seeds every cursor of the queue, set-based.
    IF NOT EXISTS (SELECT 1 FROM queen.consumer_groups_metadata m
                    WHERE m.queue_name = p_queue AND m.consumer_group = p_group)
       AND pg_try_advisory_xact_lock(hashtextextended(q.id::text || '/' || p_group, 43)) THEN
        INSERT INTO queen.consumer_groups_metadata (queue_name, consumer_group, subscription_timestamp, created_at)
        VALUES (p_queue, p_group,
                CASE WHEN p_sub_from IS NOT NULL THEN p_sub_from
                     WHEN p_sub_now OR p_sub_mode = 'new' THEN v_now END,
                v_now)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_inserted = ROW_COUNT;
        IF v_inserted = 1 THEN
            -- Locks first, in their own statement; rows another pop is creating are left to it.
            SELECT array_agg(p.id) INTO v_seed_pids
              FROM queen.log_partitions p
             WHERE p.queue_id = q.id
               AND CASE WHEN NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                          WHERE c.partition_id = p.id AND c.consumer_group = p_group)
                        THEN pg_try_advisory_xact_lock(hashtextextended(p.id::text || '/' || p_group, 42))
                        ELSE false END;
            -- Then the insert, under a snapshot taken after every lock: it cannot conflict with
            -- a row in flight.
            INSERT INTO queen.log_consumers (partition_id, consumer_group, committed)
            SELECT pid, p_group, queen.seed_cursor_v1(pid, p_queue, p_group, p_sub_mode, p_sub_from, p_sub_now)
              FROM unnest(COALESCE(v_seed_pids, '{}')) AS pid
             WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                                WHERE c.partition_id = pid AND c.consumer_group = p_group)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;

    -- The candidate scan. The write watermark keeps a caught-up consumer from scanning the whole
    -- partition set (two minutes of slack absorb the one-second quantization of last_write_at);
    -- the filter is coarse (log_pop_v1 re-verifies under the row lock); ORDER BY random() spreads
    -- consumers instead of convoying them onto the lowest name; more candidates than requested
    -- are fetched because some will be claimed concurrently or turn out empty.
    SELECT w.watermark, w.last_checked, true INTO v_watermark, v_checked, v_has_wm
      FROM queen.log_watermarks w
     WHERE w.queue_id = q.id AND w.consumer_group = p_group;
    SELECT count(*) INTO v_count
      FROM (SELECT 1 FROM queen.log_partitions p WHERE p.queue_id = q.id LIMIT 128) x;
    v_cap := CASE WHEN v_count >= 128 THEN 512 ELSE LEAST(GREATEST(v_count * 4, 64), 512) END;
    SELECT array_agg(c.name), array_agg(c.id) INTO v_names, v_pids
      FROM (SELECT p.id, p.name
              FROM queen.log_partitions p
              LEFT JOIN queen.log_consumers c
                ON c.partition_id = p.id AND c.consumer_group = p_group
             WHERE p.queue_id = q.id
               AND p.last_write_at >= COALESCE(v_watermark, '-infinity'::timestamptz) - interval '2 minutes'
               AND (c.partition_id IS NULL OR p.last_offset > c.committed)
               AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
             ORDER BY random()
             LIMIT v_cap) c;

    FOR r IN SELECT * FROM queen.log_pop_loop_v1(
        q, p_group, COALESCE(v_names, '{}'), COALESCE(v_pids, '{}'), p_worker, p_batch, p_max_partitions,
        p_auto_ack, p_lease_seconds, false, p_sub_mode, p_sub_from, p_sub_now, v_now)
    LOOP
        IF r.o_kind = 'took' THEN
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

-- Partitions with pending, claimable data for a group (coarse: log_pop_v1 re-verifies).
CREATE OR REPLACE FUNCTION queen.log_pending_partitions_v1(p_queue text, p_group text, p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT p.name
      FROM queen.queues q
      JOIN queen.log_partitions p ON p.queue_id = q.id
      LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
     WHERE q.name = p_queue
       AND ((c.partition_id IS NULL AND p.last_offset >= 0)
            OR (p.last_offset > c.committed
                AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < queen.now())))
     ORDER BY p.name
     LIMIT p_limit
$$;

-- log_has_pending_v1: false means definitively nothing to deliver to this group now.
CREATE OR REPLACE FUNCTION queen.log_has_pending_v1(p_queue text, p_group text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM queen.log_pending_partitions_v1(p_queue, p_group, 1))
$$;
