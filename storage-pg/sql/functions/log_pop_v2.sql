-- The pop of one partition: which offsets may this group take right now, under the cursor row's
-- lock, never blocking (SKIP LOCKED, advisory try-locks, inserts that cannot conflict with an
-- in-flight row). Emits one 'row' per segment slice, then one summary row whose o_kind is the
-- verdict: took | took_all | empty | leased | busy | deferred. took_all: the batch ends where the
-- partition's visible segments end, so the broker's ring need not offer it again until a push
-- (which any push landing after this snapshot reports anyway).
-- Retention gap: when retention removed segments below a cursor that had not reached them, the
-- forward scan and the batch's offsets start at the first remaining segment. A segment that
-- merely committed between the head probe and the scan is not a gap: it is left for the next pop.
-- ttl: messages older than it are skipped by every group.
-- p_conflate: the group's stored policy is last-value delivery (queen_core::claim::conflated_slice):
-- the batch is the newest visible message alone, and the cursor moves to just before it.
-- Sections, in order (the steps are those of the life of a pop in the design): step 2, the
-- windowBuffer hold; step 4, the claim (with a missing cursor row made under a try-lock and
-- seeded, step 3, then claimed again); ttl's skip of the expired prefix; conflation's newest
-- message; step 5, the head probe and the forward scan to the budget (or the empty-partition
-- seal); the took_all probe; step 6, the autoAck commit or the lease; the summary row.
CREATE OR REPLACE FUNCTION queen.log_pop_v2(
    p_pid uuid, p_queue_name text, p_group text, p_worker uuid,
    p_budget integer, p_auto_ack boolean, p_lease_seconds integer,
    p_delayed integer, p_window integer, p_skip_window boolean,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_now timestamptz, p_ttl integer,
    p_conflate boolean
) RETURNS TABLE (
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
-- enable_seqscan off: every statement here is a primary-key step, and a plan cached while a table
-- was a page or two (a fresh database, or one analyzed while empty) was a sequential scan that
-- the session kept while the table grew: the cursor probe read every cursor row, and a fresh
-- group's pops on 100k partitions ran at 0.33x for as long as that plan lived (2.1 ms a pop
-- against 0.3, pg_stat_statements). The setting costs 3-5 us a call (100-110 us, psql). jit off
-- with it: a statement with no index path (none here today) would cost past jit_above_cost and
-- be compiled at every call (see ack_batch_ends_v2).
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET jit = off
AS $$
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
    v_seed bigint;
    v_last bigint;
    v_cutoff timestamptz;
    v_skip_to bigint;
    v_live boolean := false;
    v_partial boolean := false;
    v_drained boolean;
    v_head_covers boolean := false;
    v_newest_base bigint;
    v_newest_end bigint;
    v_newest_count integer;
    v_newest_created timestamptz;
    v_newest_blob bytea;
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

    -- ttl: segments older than p_ttl seconds are skipped whole, and the cursor moves past them
    -- before anything is read. created_at is monotone in base_offset, so the expired segments
    -- are a prefix: the walk stops at the first live one and each expired segment is visited once.
    IF p_ttl > 0 THEN
        v_cutoff := p_now - make_interval(secs => p_ttl);
        v_skip_to := v_committed + 1;
        SELECT s.end_offset, s.created_at INTO v_head
          FROM queen.log_segments s
         WHERE s.partition_id = p_pid AND s.base_offset <= v_skip_to
         ORDER BY s.base_offset DESC
         LIMIT 1;
        IF FOUND AND v_head.end_offset >= v_skip_to THEN
            IF v_head.created_at >= v_cutoff THEN
                v_live := true;
            ELSE
                v_skip_to := v_head.end_offset + 1;
            END IF;
        END IF;
        IF NOT v_live THEN
            FOR v_seg IN
                SELECT s.end_offset, s.created_at
                  FROM queen.log_segments s
                 WHERE s.partition_id = p_pid AND s.base_offset > v_committed + 1
                 ORDER BY s.base_offset
            LOOP
                EXIT WHEN v_seg.created_at >= v_cutoff;
                v_skip_to := GREATEST(v_skip_to, v_seg.end_offset + 1);
            END LOOP;
        END IF;
        IF v_skip_to > v_committed + 1 THEN
            UPDATE queen.log_consumers c
               SET committed = v_skip_to - 1,
                   retry_offset = CASE WHEN c.retry_offset < v_skip_to THEN NULL ELSE c.retry_offset END,
                   retry_count = CASE WHEN c.retry_offset < v_skip_to THEN 0 ELSE c.retry_count END
             WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
            v_committed := v_skip_to - 1;
        END IF;
    END IF;

    v_wanted := v_committed + 1;
    IF p_conflate THEN
        -- Conflation: the newest visible segment, in one statement. Pushes of a partition commit
        -- in offset order, so nothing below it can commit later: what the cursor passes is older
        -- than the message delivered, never newer. The walk from the newest end reads only the
        -- invisible (delayedProcessing) suffix before its row.
        SELECT s.base_offset, s.end_offset, s.msg_count, s.created_at, s.blob
          INTO v_newest_base, v_newest_end, v_newest_count, v_newest_created, v_newest_blob
          FROM queen.log_segments s
         WHERE s.partition_id = p_pid
           AND (p_delayed = 0 OR s.created_at <= p_now - make_interval(secs => p_delayed))
         ORDER BY s.base_offset DESC
         LIMIT 1;
        IF v_newest_end >= v_wanted THEN
            -- Retire everything behind the newest message (counted as consumed); a pending
            -- retry count of a retired offset is over. The message itself is leased as usual.
            IF v_newest_end - 1 > v_committed THEN
                UPDATE queen.log_consumers c
                   SET committed = v_newest_end - 1,
                       total_consumed = c.total_consumed + (v_newest_end - 1 - c.committed),
                       retry_offset = CASE WHEN c.retry_offset <= v_newest_end - 1 THEN NULL
                                           ELSE c.retry_offset END,
                       retry_count = CASE WHEN c.retry_offset <= v_newest_end - 1 THEN 0
                                          ELSE c.retry_count END
                 WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
            END IF;
            v_wanted := v_newest_end;
            o_kind := 'row'; o_base := v_newest_base; o_start := (v_newest_end - v_newest_base)::integer;
            o_take := 1; o_count := v_newest_count; o_created := v_newest_created; o_blob := v_newest_blob;
            RETURN NEXT;
            v_taken := 1;
        ELSIF p_delayed > 0 THEN
            -- Nothing visible past the cursor: when the first message past it becomes visible.
            SELECT s.created_at INTO v_first_invisible
              FROM queen.log_segments s
             WHERE s.partition_id = p_pid AND s.base_offset > COALESCE(v_newest_base, -1)
               AND s.end_offset >= v_wanted
             ORDER BY s.base_offset
             LIMIT 1;
        END IF;
        -- The head probe and the forward scan below take nothing more.
        v_left := 0;
    END IF;

    -- Step 5, the head probe: one backward step for the greatest base_offset <= wanted, written as
    -- a bare LIMIT 1 with the covering test applied afterwards, so a miss never walks the head.
    IF NOT p_conflate THEN
        SELECT s.base_offset, s.end_offset, s.msg_count, s.created_at, s.blob INTO v_head
          FROM queen.log_segments s
         WHERE s.partition_id = p_pid AND s.base_offset <= v_wanted
         ORDER BY s.base_offset DESC
         LIMIT 1;
        v_head_covers := FOUND AND v_head.end_offset >= v_wanted;
    END IF;
    IF v_head_covers THEN
        IF p_delayed > 0 AND v_head.created_at > p_now - make_interval(secs => p_delayed) THEN
            v_first_invisible := v_head.created_at;
        ELSE
            v_take := LEAST(v_head.end_offset - v_wanted + 1, v_left)::integer;
            v_partial := v_take < v_head.end_offset - v_wanted + 1;
            o_kind := 'row'; o_base := v_head.base_offset; o_start := (v_wanted - v_head.base_offset)::integer;
            o_take := v_take; o_count := v_head.msg_count; o_created := v_head.created_at; o_blob := v_head.blob;
            RETURN NEXT;
            v_left := v_left - v_take;
            v_taken := v_taken + v_take;
        END IF;
    END IF;

    -- The forward scan is a cursor loop that leaves at the budget. delayedProcessing cuts a
    -- contiguous suffix (created_at is monotone), so the first invisible segment ends the scan.
    -- The LIMIT is what keeps a deep backlog costing only the rows delivered: every segment holds
    -- a message, so v_left rows are enough, and without it PL/pgSQL plans the loop's query for
    -- all of its rows (a bitmap scan of the partition's whole backlog, then a sort: 6-22 ms at
    -- 3,000 segments, where the ordered index walk reads ten rows).
    IF v_left > 0 AND v_first_invisible IS NULL THEN
        FOR v_seg IN
            SELECT s.base_offset, s.msg_count, s.created_at, s.blob
              FROM queen.log_segments s
             WHERE s.partition_id = p_pid AND s.base_offset > v_wanted
             ORDER BY s.base_offset
             LIMIT v_left
        LOOP
            IF p_delayed > 0 AND v_seg.created_at > p_now - make_interval(secs => p_delayed) THEN
                IF v_taken = 0 THEN
                    v_first_invisible := v_seg.created_at;
                END IF;
                EXIT;
            END IF;
            IF v_taken = 0 AND v_seg.base_offset > v_wanted THEN
                -- Either retention removed a prefix the cursor had not reached (a real gap: the
                -- batch starts at this segment, and so do its offsets), or the segment covering
                -- v_wanted committed after the head probe's snapshot. Pushes commit in offset
                -- order, so under this later snapshot it is visible: then take nothing now
                -- rather than skip it.
                PERFORM 1
                   FROM (SELECT s.end_offset FROM queen.log_segments s
                          WHERE s.partition_id = p_pid AND s.base_offset <= v_wanted
                          ORDER BY s.base_offset DESC
                          LIMIT 1) h
                  WHERE h.end_offset >= v_wanted;
                IF FOUND THEN
                    EXIT;
                END IF;
                v_wanted := v_seg.base_offset;
            END IF;
            v_take := LEAST(v_seg.msg_count, v_left);
            v_partial := v_take < v_seg.msg_count;
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
        -- so they are never sealed past. One statement, so one snapshot: a push stores its
        -- segment and its last_offset together, so a concurrent push is either seen (no seal)
        -- or lands above the last_offset sealed to and stays pending. (Read in two statements,
        -- a push committing between them was sealed past.) The first-segment probe is written
        -- as ORDER BY ... LIMIT 1, the primary key's order: a bare EXISTS averaged 0.64 ms a
        -- call in the consume benchmark (pg_stat_statements), against 0.015 ms for the head
        -- probe's primary-key step.
        -- A cursor seal, not a claim: no lease field changes.
        UPDATE queen.log_consumers c SET committed = p.last_offset
          FROM queen.log_partitions p
         WHERE c.partition_id = p_pid AND c.consumer_group = p_group
           AND p.id = p_pid AND p.last_offset > c.committed
           AND (SELECT s.base_offset FROM queen.log_segments s
                 WHERE s.partition_id = p_pid
                 ORDER BY s.base_offset
                 LIMIT 1) IS NULL;
        o_kind := 'empty';
        RETURN NEXT;
        RETURN;
    END IF;

    v_last := v_wanted + v_taken - 1;
    -- Drained: an index-only probe past the batch; a batch ending inside a segment is never the
    -- end.
    v_drained := NOT v_partial AND NOT EXISTS (
        SELECT 1 FROM queen.log_segments s WHERE s.partition_id = p_pid AND s.base_offset > v_last);

    -- Step 6: autoAck commits inside the pop (at-most-once); otherwise lease (committed, last].
    o_kind := CASE WHEN v_drained THEN 'took_all' ELSE 'took' END;
    o_first := v_wanted; o_last := v_last;
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
