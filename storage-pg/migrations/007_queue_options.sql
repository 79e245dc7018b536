-- Queue options 0.15 stored but never enforced (its flaw 6), enforced here:
--   retryDelay          a failed ack holds the partition for the group (a nil-id "lease") that long;
--   deadLetterQueue     off: exhausted or `dlq`-acked messages are discarded instead of filed;
--   dlqAfterMaxRetries  off: retryLimit is not enforced, a message is retried until acknowledged;
--   maxSize             a push that would take the queue's backlog past it is refused;
--   ttl                 messages older than it are skipped by every group.
-- The defaults keep 0.15's observable behaviour: dead letters on, no expiry. Existing rows that
-- still carry 0.15's never-enforced defaults get the same treatment.

ALTER TABLE queen.queues ALTER COLUMN ttl SET DEFAULT 0;
ALTER TABLE queen.queues ALTER COLUMN dead_letter_queue SET DEFAULT true;
ALTER TABLE queen.queues ALTER COLUMN dlq_after_max_retries SET DEFAULT true;
UPDATE queen.queues SET ttl = 0 WHERE ttl = 3600;
UPDATE queen.queues SET dead_letter_queue = true, dlq_after_max_retries = true
 WHERE NOT dead_letter_queue AND NOT dlq_after_max_retries;

-- log_pop_v1 gains p_ttl: the old signature goes, so nothing can call the unexpiring version.
DROP FUNCTION IF EXISTS queen.log_pop_v1(uuid, text, text, uuid, integer, boolean, integer, integer,
    integer, boolean, text, timestamptz, boolean, timestamptz);

CREATE OR REPLACE FUNCTION queen.log_pop_v1(
    p_pid uuid, p_queue_name text, p_group text, p_worker uuid,
    p_budget integer, p_auto_ack boolean, p_lease_seconds integer,
    p_delayed integer, p_window integer, p_skip_window boolean,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_now timestamptz, p_ttl integer
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
    v_cutoff timestamptz;
    v_skip_to bigint;
    v_live boolean := false;
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
                p_sub_mode, p_sub_from, p_sub_now, p_now, p_queue.ttl)
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

CREATE OR REPLACE FUNCTION queen.ack_v1(
    p_group text, p_partition_ids text[], p_txids text[], p_statuses text[],
    p_lease_ids text[], p_errors text[]
) RETURNS TABLE (
    o_success boolean, o_error text, o_queue text, o_partition text, o_lease_released boolean, o_dlq boolean
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := queen.now();
    v_n integer := COALESCE(array_length(p_txids, 1), 0);
    v_pids uuid[];
    v_offs bigint[];
    -- Per distinct partition (sorted by id): names, budget, the cursor row and the call state.
    d_pids uuid[] := '{}';
    d_qid uuid[] := '{}';
    d_queue text[] := '{}';
    d_pname text[] := '{}';
    d_retry integer[] := '{}';
    d_delay integer[] := '{}';
    d_keep boolean[] := '{}';
    d_dlq_after boolean[] := '{}';
    d_hold boolean[] := '{}';
    d_rows queen.log_consumers[] := '{}';
    d_has boolean[] := '{}';
    d_worker uuid[] := '{}';
    d_live boolean[] := '{}';
    d_barrier bigint[] := '{}';
    d_release boolean[] := '{}';
    d_dirty boolean[] := '{}';
    r record;
    c queen.log_consumers;
    k integer;
    i integer;
    v_off bigint;
    v_to bigint;
    v_barrier bigint;
    v_ok boolean;
    v_err text;
    v_released boolean;
    v_dlq boolean;
    r_success boolean[] := '{}';
    r_error text[] := '{}';
    r_queue text[] := '{}';
    r_partition text[] := '{}';
    r_released boolean[] := '{}';
    r_dlq boolean[] := '{}';
    r_k integer[] := '{}';
    v_write queen.log_consumers[] := '{}';
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_pids := ARRAY(
        SELECT CASE WHEN u.x ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN u.x::uuid END
          FROM unnest(p_partition_ids) WITH ORDINALITY AS u (x, o) ORDER BY u.o);
    v_offs := ARRAY(
        SELECT t.msg_offset
          FROM unnest(v_pids, p_txids) WITH ORDINALITY AS u (pid, tx, o)
          LEFT JOIN queen.log_txids t ON t.partition_id = u.pid AND t.transaction_id = u.tx
         ORDER BY u.o);
    FOR r IN
        SELECT p.id, p.name, q.id AS qid, q.name AS qname, q.retry_limit, q.retry_delay,
               q.dead_letter_queue, q.dlq_after_max_retries
          FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
         WHERE p.id = ANY (v_pids)
         ORDER BY p.id
    LOOP
        d_pids := d_pids || r.id; d_qid := d_qid || r.qid; d_queue := d_queue || r.qname;
        d_pname := d_pname || r.name; d_retry := d_retry || r.retry_limit;
        d_delay := d_delay || r.retry_delay; d_keep := d_keep || r.dead_letter_queue;
        d_dlq_after := d_dlq_after || r.dlq_after_max_retries; d_hold := d_hold || false;
        d_rows := d_rows || NULL::queen.log_consumers; d_has := d_has || false;
        d_worker := d_worker || NULL::uuid; d_live := d_live || false; d_barrier := d_barrier || NULL::bigint;
        d_release := d_release || false; d_dirty := d_dirty || false;
    END LOOP;
    -- Each cursor row locked once, in partition-id order.
    FOR c IN
        SELECT * FROM queen.log_consumers lc
         WHERE lc.partition_id = ANY (d_pids) AND lc.consumer_group = p_group
         ORDER BY lc.partition_id
           FOR UPDATE
    LOOP
        k := array_position(d_pids, c.partition_id);
        d_rows[k] := c;
        d_has[k] := true;
        d_worker[k] := c.worker_id;
        d_live[k] := c.worker_id IS NOT NULL AND c.lease_expires_at IS NOT NULL AND c.lease_expires_at >= v_now;
    END LOOP;

    FOR i IN 1 .. v_n LOOP
        v_ok := false; v_err := NULL; v_released := false; v_dlq := false;
        k := array_position(d_pids, v_pids[i]);
        v_off := v_offs[i];
        <<item>>
        BEGIN
            IF k IS NULL OR v_off IS NULL THEN
                v_err := 'Message not found';
                EXIT item;
            END IF;
            IF NOT d_has[k] THEN
                v_err := 'Message not delivered to this consumer group';
                EXIT item;
            END IF;
            c := d_rows[k];
            IF v_off <= c.committed THEN
                -- Already committed: idempotent, whatever lease it names.
                v_ok := true;
                EXIT item;
            END IF;
            IF COALESCE(p_lease_ids[i], '') <> ''
               AND (NOT d_live[k] OR d_worker[k] IS NULL OR d_worker[k]::text <> p_lease_ids[i]) THEN
                v_err := 'Invalid or expired lease';
                EXIT item;
            END IF;
            IF c.batch_end IS NULL OR v_off > c.batch_end THEN
                v_err := 'Message not delivered';
                EXIT item;
            END IF;
            v_ok := true;
            v_barrier := d_barrier[k];
            v_to := NULL;
            CASE p_statuses[i]
                WHEN 'completed', 'success' THEN
                    v_to := v_off;
                WHEN 'failed' THEN
                    c.retry_count := CASE WHEN c.retry_offset = v_off THEN c.retry_count + 1 ELSE 1 END;
                    c.retry_offset := v_off;
                    IF d_dlq_after[k] AND c.retry_count > d_retry[k] AND v_off = c.committed + 1
                       AND v_barrier IS NULL THEN
                        v_dlq := true;
                        v_to := v_off;
                    ELSE
                        d_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                        d_release[k] := true;
                        d_hold[k] := true;
                    END IF;
                WHEN 'retry' THEN
                    d_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                    d_release[k] := true;
                WHEN 'dlq' THEN
                    IF v_off = c.committed + 1 AND v_barrier IS NULL THEN
                        v_dlq := true;
                        v_to := v_off;
                    ELSE
                        c.retry_offset := v_off;
                        c.retry_count := 1073741823;
                        d_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                        d_release[k] := true;
                    END IF;
                ELSE
                    v_ok := false;
                    v_err := 'Unknown status';
                    EXIT item;
            END CASE;
            -- deadLetterQueue off: the message is discarded (the cursor still moves past it).
            IF v_dlq AND NOT d_keep[k] THEN
                v_dlq := false;
                v_barrier := NULL;
            ELSIF v_dlq THEN
                INSERT INTO queen.dead_letters (queue_id, partition_id, partition_name, consumer_group,
                                                msg_offset, transaction_id, error, retry_count, failed_at)
                VALUES (d_qid[k], d_pids[k], d_pname[k], p_group, v_off, p_txids[i], p_errors[i], c.retry_count, v_now);
                v_barrier := NULL;
            END IF;
            IF v_to IS NOT NULL THEN
                IF v_barrier IS NOT NULL THEN
                    v_to := LEAST(v_to, v_barrier - 1);
                END IF;
                IF v_to > c.committed THEN
                    c.total_consumed := c.total_consumed + (v_to - c.committed);
                    c.committed := v_to;
                    IF c.retry_offset IS NOT NULL AND c.retry_offset <= v_to THEN
                        c.retry_offset := NULL;
                        c.retry_count := 0;
                    END IF;
                END IF;
            END IF;
            IF c.batch_end IS NOT NULL AND c.committed >= c.batch_end THEN
                c.worker_id := NULL; c.lease_expires_at := NULL; c.lease_acquired_at := NULL; c.batch_end := NULL;
                v_released := true;
            END IF;
            d_rows[k] := c;
            d_dirty[k] := true;
        END item;
        r_success := r_success || v_ok;
        r_error := r_error || v_err;
        r_queue := r_queue || CASE WHEN k IS NOT NULL AND v_off IS NOT NULL THEN d_queue[k] END;
        r_partition := r_partition || CASE WHEN k IS NOT NULL AND v_off IS NOT NULL THEN d_pname[k] END;
        r_released := r_released || v_released;
        r_dlq := r_dlq || v_dlq;
        r_k := r_k || k;
    END LOOP;

    -- Failed or retried messages end the lease at the end of the call (if it is still the lease
    -- the call began with): redelivery from the cursor.
    FOR k IN 1 .. COALESCE(array_length(d_pids, 1), 0) LOOP
        IF d_release[k] AND d_has[k] THEN
            c := d_rows[k];
            IF c.worker_id IS NOT NULL AND c.worker_id = d_worker[k] THEN
                IF d_hold[k] AND d_delay[k] > 0 THEN
                    -- retryDelay: a hold no consumer of the group can claim (or renew) until it ends.
                    c.worker_id := '00000000-0000-0000-0000-000000000000';
                    c.lease_expires_at := v_now + d_delay[k] * interval '1 millisecond';
                ELSE
                    c.worker_id := NULL; c.lease_expires_at := NULL;
                END IF;
                c.lease_acquired_at := NULL; c.batch_end := NULL;
                d_rows[k] := c;
                d_dirty[k] := true;
                FOR i IN 1 .. v_n LOOP
                    IF r_k[i] = k AND r_success[i] THEN
                        r_released[i] := true;
                    END IF;
                END LOOP;
            END IF;
        END IF;
    END LOOP;

    -- Each changed cursor row written once.
    FOR k IN 1 .. COALESCE(array_length(d_pids, 1), 0) LOOP
        IF d_dirty[k] THEN
            v_write := v_write || d_rows[k];
        END IF;
    END LOOP;
    UPDATE queen.log_consumers lc
       SET committed = x.committed, worker_id = x.worker_id, lease_expires_at = x.lease_expires_at,
           lease_acquired_at = x.lease_acquired_at, batch_end = x.batch_end,
           total_consumed = x.total_consumed, retry_offset = x.retry_offset, retry_count = x.retry_count
      FROM unnest(v_write) AS x
     WHERE lc.partition_id = x.partition_id AND lc.consumer_group = p_group;

    FOR i IN 1 .. v_n LOOP
        o_success := r_success[i]; o_error := r_error[i]; o_queue := r_queue[i]; o_partition := r_partition[i];
        o_lease_released := r_released[i]; o_dlq := r_dlq[i];
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION queen.push_v1(
    p_queue text, p_partition text, p_txids text[], p_message_ids uuid[], p_blob bytea
) RETURNS TABLE (o_status text, o_message_id uuid, o_partition_id uuid, o_offset bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_qid uuid;
    v_pid uuid;
    v_last bigint;
    v_n integer := COALESCE(array_length(p_txids, 1), 0);
    v_created timestamptz;
    v_cap integer := 0;
    v_backlog bigint;
BEGIN
    SELECT q.id, q.max_size INTO v_qid, v_cap FROM queen.queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        -- Created on first use: namespace is the text before the first '.', task the second
        -- '.'-segment.
        INSERT INTO queen.queues (name, namespace, task)
        VALUES (p_queue, split_part(p_queue, '.', 1), split_part(p_queue, '.', 2))
        ON CONFLICT (name) DO NOTHING;
        SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    END IF;
    -- maxSize: capped queues serialize their pushes on the queue row, taken before the partition
    -- row (the order every push uses, so no deadlock). Uncapped queues pay nothing.
    IF COALESCE(v_cap, 0) > 0 THEN
        PERFORM 1 FROM queen.queues q WHERE q.id = v_qid FOR NO KEY UPDATE;
    END IF;
    -- FOR NO KEY UPDATE, not FOR UPDATE: pushes still serialize on the row (offsets in commit
    -- order), but a pop creating a cursor row takes FOR KEY SHARE on it for the foreign key and
    -- must never wait on a push.
    SELECT p.id, p.last_offset INTO v_pid, v_last
      FROM queen.log_partitions p
     WHERE p.queue_id = v_qid AND p.name = p_partition
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
        VALUES (gen_random_uuid(), v_qid, p_partition, -1, date_trunc('second', queen.now()))
        ON CONFLICT (queue_id, name) DO NOTHING;
        SELECT p.id, p.last_offset INTO v_pid, v_last
          FROM queen.log_partitions p
         WHERE p.queue_id = v_qid AND p.name = p_partition
           FOR NO KEY UPDATE;
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM queen.log_txids t WHERE t.partition_id = v_pid AND t.transaction_id = ANY (p_txids)) THEN
        RETURN QUERY
            SELECT CASE WHEN t.message_id IS NULL THEN 'retry' ELSE 'duplicate' END,
                   COALESCE(t.message_id, u.mid), v_pid, t.msg_offset
              FROM unnest(p_txids, p_message_ids) WITH ORDINALITY AS u (tx, mid, ord)
              LEFT JOIN queen.log_txids t ON t.partition_id = v_pid AND t.transaction_id = u.tx
             ORDER BY u.ord;
        RETURN;
    END IF;
    IF COALESCE(v_cap, 0) > 0 THEN
        -- The backlog: per partition, from the slowest cursor (or the start) to the head.
        SELECT COALESCE(sum(GREATEST(p.last_offset - COALESCE(
                   (SELECT min(c.committed) FROM queen.log_consumers c WHERE c.partition_id = p.id), -1), 0)), 0)
          INTO v_backlog
          FROM queen.log_partitions p
         WHERE p.queue_id = v_qid;
        IF v_backlog + v_n > v_cap THEN
            RETURN QUERY
                SELECT 'full:' || v_cap || ':' || v_backlog, u.mid, v_pid, NULL::bigint
                  FROM unnest(p_message_ids) WITH ORDINALITY AS u (mid, ord)
                 ORDER BY u.ord;
            RETURN;
        END IF;
    END IF;
    -- created_at must be monotone in base_offset (the window probe and the delay filter rely on
    -- it), but a push that began earlier may take the lock later: never go below the newest.
    SELECT GREATEST(clock_timestamp() + (queen.now() - now()), max(s.created_at)) INTO v_created
      FROM (SELECT s.created_at FROM queen.log_segments s
             WHERE s.partition_id = v_pid ORDER BY s.base_offset DESC LIMIT 1) s;
    INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
    SELECT v_pid, u.tx, v_last + u.ord, u.mid
      FROM unnest(p_txids, p_message_ids) WITH ORDINALITY AS u (tx, mid, ord);
    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
    VALUES (v_pid, v_last + 1, v_last + v_n, v_n, v_created, p_blob);
    UPDATE queen.log_partitions p
       SET last_offset = v_last + v_n, last_write_at = date_trunc('second', v_created)
     WHERE p.id = v_pid;
    -- Delivered at commit to every broker listening: their parked consumers wake at once
    -- instead of at the next ring reseed.
    PERFORM pg_notify('queen_push', p_queue || E'\n' || p_partition || E'\n' || v_n);
    RETURN QUERY
        SELECT 'queued'::text, u.mid, v_pid, v_last + u.ord
          FROM unnest(p_message_ids) WITH ORDINALITY AS u (mid, ord)
         ORDER BY u.ord;
END
$$;

-- Extends every live lease held under a lease id to at least now + seconds. An expired lease is
-- not revived, and a retry-delay hold (the nil id) is nobody's lease.
CREATE OR REPLACE FUNCTION queen.renew_lease_v1(p_lease text, p_seconds integer)
RETURNS TABLE (o_renewed integer, o_expires timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := queen.now();
    v_lease uuid := CASE WHEN p_lease ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                         THEN p_lease::uuid END;
BEGIN
    RETURN QUERY
    WITH renewed AS (
        UPDATE queen.log_consumers c
           SET lease_expires_at = GREATEST(c.lease_expires_at, v_now + make_interval(secs => p_seconds))
         WHERE c.worker_id = v_lease AND c.lease_expires_at >= v_now
           AND c.worker_id <> '00000000-0000-0000-0000-000000000000'
        RETURNING c.lease_expires_at
    )
    SELECT count(*)::integer, max(r.lease_expires_at) FROM renewed r;
END
$$;
