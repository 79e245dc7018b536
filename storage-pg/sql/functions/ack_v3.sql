-- Acks: positional cursor advances fenced by the lease. A completed ack of offset o commits
-- everything up to o; below the cursor it succeeds and says so (o_noop). A failed ack charges that
-- message's own retry budget; a call holding a nack applies its items of one partition in offset
-- order (ties in the call's order, answers in the call's order), and a failed (or retried)
-- message is a barrier that no completed ack of the call moves the cursor past, wherever the
-- call lists it, so it is redelivered or dead-lettered, never lost. A nack ends the lease,
-- dead-lettering included (its consumer drops the rest of the batch, which comes again at once);
-- a nack below the cursor is refused (already committed: it can be neither retried nor
-- dead-lettered, and the caller is told). The cursor never moves back. ack_v2 stays for brokers
-- of the version before during a rolling deploy. Each touched cursor row is locked once (in
-- partition-id order, so concurrent acks never deadlock) and written once.
-- Options: retryDelay holds the partition for the group (a nil-id "lease") that long after a
-- failed ack; deadLetterQueue off discards what would be filed; dlqAfterMaxRetries off retries
-- until acknowledged.
-- Partitions are named by id or by number (a framed pop's partitionId); the broker parses which,
-- so one of p_partition_ids[i] and p_partition_numbers[i] is set (neither: not found).
-- Two paths with one meaning. A call of only completed acks (a consumer acking its batch) is one
-- statement: its per-item loop cost 1.7 of the 3.3 ms of a 100-item ack in the leased-consume
-- profile (docs/benchmarks.md). Every other call runs the loop below, item by item. The
-- differential suite holds both to the model's item-by-item ack.
-- Generic plans, always: with arrays for parameters the plan cache judged each call's custom plan
-- cheaper and planned the partition and transaction-id lookups again on every call (0.2 ms of
-- the 1.3 ms a one-item ack took in a stream-cycle profile, pg_stat_statements with
-- track_planning); their generic plans are the same index probes.
-- Sections, in order (each marked below):
--   1. Each item's partition (by id or number) and stored offset: one probe per item.
--   2. A call of only completed acks: answered by one set-based statement, and done.
--   3. Otherwise, per distinct partition in id order, its queue's options (the d_* arrays).
--   4. Each cursor row locked once, in partition-id order, and whether its lease is live.
--   5. The items in offset order per partition: advance, no-op, refusal, retry or dead letter;
--      a failed item is a barrier the cursor does not pass.
--   6. The leases a failure touched end (a retryDelay hold, or redelivery from the cursor).
--   7. Each changed cursor row written once; the answers in the call's order.
CREATE OR REPLACE FUNCTION queen.ack_v3(
    p_group text, p_partition_ids uuid[], p_partition_numbers bigint[], p_txids text[],
    p_statuses text[], p_lease_ids text[], p_errors text[]
) RETURNS TABLE (
    o_success boolean, o_error text, o_queue text, o_partition text, o_lease_released boolean, o_dlq boolean,
    o_noop boolean
)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now timestamptz := queen.now();
    v_n integer := COALESCE(array_length(p_txids, 1), 0);
    v_pids uuid[];
    v_offs bigint[];
    v_parts uuid[];
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
    v_noop boolean;
    r_success boolean[];
    r_error text[];
    r_queue text[];
    r_partition text[];
    r_released boolean[];
    r_dlq boolean[];
    r_noop boolean[];
    r_k integer[];
    v_order integer[];
    v_write queen.log_consumers[] := '{}';
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- 1. Each item's partition and stored offset.
    v_pids := ARRAY(
        SELECT COALESCE(u.id, (SELECT p.id FROM queen.log_partitions p WHERE p.seq = u.num))
          FROM unnest(p_partition_ids, p_partition_numbers) WITH ORDINALITY AS u (id, num, o)
         ORDER BY u.o);
    -- One primary-key probe per item, written as a scalar subquery: as a join it was planned as a
    -- hash join over a sequential scan of the whole table (every ack read every stored id).
    v_offs := ARRAY(
        SELECT (SELECT t.msg_offset FROM queen.log_txids t
                 WHERE t.partition_id = u.pid AND t.transaction_id = u.tx)
          FROM unnest(v_pids, p_txids) WITH ORDINALITY AS u (pid, tx, o)
         ORDER BY u.o);

    -- 2. Only completed acks: one set-based statement.
    IF NOT EXISTS (SELECT 1 FROM unnest(p_statuses) AS s (st)
                    WHERE s.st IS DISTINCT FROM 'completed' AND s.st IS DISTINCT FROM 'success') THEN
        -- Only completed acks: the loop's outcome, set-based. An item advances the cursor when its
        -- partition's cursor row exists, its lease (if named) is the live one and it lies in the
        -- delivered batch; it is an idempotent success when an earlier advancing item of the call
        -- (or the cursor before the call) already covers it. The cursor ends at the highest
        -- advancing offset, and the item that reaches the batch end releases the lease.
        -- The partitions as an array: as a join on the items, both lookups below were planned
        -- as sequential scans of every partition and cursor row.
        v_parts := ARRAY(SELECT DISTINCT x.pid FROM unnest(v_pids) AS x (pid) WHERE x.pid IS NOT NULL ORDER BY 1);
        RETURN QUERY
        WITH item AS (
            SELECT u.o, u.pid, u.off, NULLIF(u.lease, '') AS lease
              FROM unnest(v_pids, v_offs, p_lease_ids) WITH ORDINALITY AS u (pid, off, lease, o)
        ),
        part AS (
            SELECT p.id, p.name, q.name AS qname
              FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
             WHERE p.id = ANY (v_parts)
        ),
        cur AS MATERIALIZED (
            SELECT lc.partition_id, lc.committed, lc.worker_id, lc.lease_expires_at, lc.batch_end
              FROM queen.log_consumers lc
             WHERE lc.partition_id = ANY (v_parts) AND lc.consumer_group = p_group
             ORDER BY lc.partition_id
               FOR UPDATE
        ),
        judged AS (
            SELECT it.o, it.pid, it.off, pa.qname, pa.name AS pname,
                   pa.id IS NOT NULL AND it.off IS NOT NULL AS found,
                   cr.partition_id IS NOT NULL AS has,
                   cr.committed AS c0,
                   cr.batch_end AS be0,
                   it.lease IS NULL
                       OR (cr.worker_id IS NOT NULL AND cr.lease_expires_at IS NOT NULL
                           AND cr.lease_expires_at >= v_now AND cr.worker_id::text = it.lease) AS lease_ok
              FROM item it
              LEFT JOIN part pa ON pa.id = it.pid
              LEFT JOIN cur cr ON cr.partition_id = pa.id
        ),
        advancing AS (
            SELECT j.*,
                   j.found AND j.has AND j.lease_ok AND j.be0 IS NOT NULL AND j.off <= j.be0 AS advances
              FROM judged j
        ),
        covered AS (
            SELECT a.*,
                   GREATEST(a.c0, max(CASE WHEN a.advances THEN a.off END)
                       OVER (PARTITION BY a.pid ORDER BY a.o
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS before
              FROM advancing a
        ),
        outcome AS (
            SELECT cv.o, cv.pid, cv.off, cv.found, cv.qname, cv.pname, cv.advances,
                   cv.found AND cv.has AND cv.off <= cv.before AS noop,
                   CASE WHEN NOT cv.found THEN 'Message not found: its transactionId is unresolvable in that partition'
                        WHEN NOT cv.has THEN 'Message not delivered to this consumer group'
                        WHEN cv.off <= cv.before THEN NULL
                        WHEN NOT cv.lease_ok THEN 'Invalid or expired lease'
                        WHEN NOT cv.advances THEN 'Message not delivered'
                   END AS err,
                   cv.found AND cv.has AND cv.advances AND cv.off > cv.before AND cv.off >= cv.be0 AS releases
              FROM covered cv
        ),
        target AS (
            SELECT o.pid, max(o.off) AS committed
              FROM outcome o
             WHERE o.advances
             GROUP BY o.pid
        ),
        written AS (
            UPDATE queen.log_consumers lc
               SET committed = t.committed,
                   total_consumed = lc.total_consumed + (t.committed - lc.committed),
                   retry_offset = CASE WHEN lc.retry_offset <= t.committed THEN NULL ELSE lc.retry_offset END,
                   retry_count = CASE WHEN lc.retry_offset <= t.committed THEN 0 ELSE lc.retry_count END,
                   worker_id = CASE WHEN t.committed >= lc.batch_end THEN NULL ELSE lc.worker_id END,
                   lease_expires_at = CASE WHEN t.committed >= lc.batch_end THEN NULL ELSE lc.lease_expires_at END,
                   lease_acquired_at = CASE WHEN t.committed >= lc.batch_end THEN NULL ELSE lc.lease_acquired_at END,
                   batch_end = CASE WHEN t.committed >= lc.batch_end THEN NULL ELSE lc.batch_end END
              FROM target t
             WHERE lc.partition_id = ANY (v_parts) AND lc.consumer_group = p_group
               AND lc.partition_id = t.pid AND t.committed > lc.committed
            RETURNING lc.partition_id
        )
        SELECT o.err IS NULL, o.err,
               CASE WHEN o.found THEN o.qname END, CASE WHEN o.found THEN o.pname END,
               COALESCE(o.releases, false), false, COALESCE(o.noop, false)
          FROM outcome o
         ORDER BY o.o;
        RETURN;
    END IF;

    -- 3. Per distinct partition, in id order: its queue's options.
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
    -- 4. Each cursor row locked once, in partition-id order.
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

    -- 5. (A call of completed acks only was answered above, in its own order.) Offset order within
    -- each partition: a nack listed after a completed ack of a later message still bounds it (the
    -- caller that acks its successes, then its failures, loses none).
    v_order := ARRAY(SELECT u.o::integer
                       FROM unnest(v_pids, v_offs) WITH ORDINALITY AS u (pid, off, o)
                      ORDER BY u.pid, u.off, u.o);
    r_success := array_fill(NULL::boolean, ARRAY[v_n]);
    r_error := array_fill(NULL::text, ARRAY[v_n]);
    r_queue := array_fill(NULL::text, ARRAY[v_n]);
    r_partition := array_fill(NULL::text, ARRAY[v_n]);
    r_released := array_fill(NULL::boolean, ARRAY[v_n]);
    r_dlq := array_fill(NULL::boolean, ARRAY[v_n]);
    r_noop := array_fill(NULL::boolean, ARRAY[v_n]);
    r_k := array_fill(NULL::integer, ARRAY[v_n]);
    FOREACH i IN ARRAY v_order LOOP
        v_ok := false; v_err := NULL; v_released := false; v_dlq := false; v_noop := false;
        k := array_position(d_pids, v_pids[i]);
        v_off := v_offs[i];
        <<item>>
        BEGIN
            IF k IS NULL OR v_off IS NULL THEN
                v_err := 'Message not found: its transactionId is unresolvable in that partition';
                EXIT item;
            END IF;
            IF NOT d_has[k] THEN
                v_err := 'Message not delivered to this consumer group';
                EXIT item;
            END IF;
            c := d_rows[k];
            IF v_off <= c.committed THEN
                -- Already committed: a completed ack is idempotent, whatever lease it names; a
                -- nack can no longer be honoured, and says so.
                IF p_statuses[i] IN ('completed', 'success') THEN
                    v_ok := true;
                    v_noop := true;
                ELSE
                    v_err := 'Message already committed: the cursor is past it, so it can be neither retried nor dead-lettered';
                END IF;
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
                        d_release[k] := true;
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
                        d_release[k] := true;
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
        r_success[i] := v_ok;
        r_error[i] := v_err;
        r_queue[i] := CASE WHEN k IS NOT NULL AND v_off IS NOT NULL THEN d_queue[k] END;
        r_partition[i] := CASE WHEN k IS NOT NULL AND v_off IS NOT NULL THEN d_pname[k] END;
        r_released[i] := v_released;
        r_dlq[i] := v_dlq;
        r_noop[i] := v_noop;
        r_k[i] := k;
    END LOOP;

    -- 6. Failed, retried or dead-lettered messages end the lease at the end of the call (if it is still the lease
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

    -- 7. Each changed cursor row written once; the answers in the call's order.
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
        o_lease_released := r_released[i]; o_dlq := r_dlq[i]; o_noop := r_noop[i];
        RETURN NEXT;
    END LOOP;
END
$$;
