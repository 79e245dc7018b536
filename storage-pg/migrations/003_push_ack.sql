-- Push, ack, lease renewal, queue configuration, deletion and retention.

-- One (queue, partition) group of a push request. The partition row's lock is held to commit, so
-- offsets are allocated in commit order (no commit-order skip). Duplicates by (partition,
-- transactionId) answer the original message id; when any item is a duplicate nothing is
-- appended and every other item answers 'retry': the broker rebuilds the blob without the
-- duplicates and calls again in the same transaction (the lock is still held, so the answer
-- cannot change). The common case, no duplicates, is one call.
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
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        -- Created on first use: namespace is the text before the first '.', task the second
        -- '.'-segment.
        INSERT INTO queen.queues (name, namespace, task)
        VALUES (p_queue, split_part(p_queue, '.', 1), split_part(p_queue, '.', 2))
        ON CONFLICT (name) DO NOTHING;
        SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
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
    RETURN QUERY
        SELECT 'queued'::text, u.mid, v_pid, v_last + u.ord
          FROM unnest(p_message_ids) WITH ORDINALITY AS u (mid, ord)
         ORDER BY u.ord;
END
$$;

-- Acks: positional cursor advances fenced by the lease. A completed ack of offset o commits
-- everything up to o. A failed ack charges that message's own retry budget; within one call a
-- failed (or retried) message is a barrier that later completed acks never move the cursor past,
-- so it is redelivered or dead-lettered, never lost. The cursor never moves backwards.
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
    v_pid uuid;
    v_part record;
    v_off bigint;
    c queen.log_consumers;
    k integer;
    v_to bigint;
    v_barrier bigint;
    -- Per partition touched by this call: the lease as it stood (the fence), the barrier, and
    -- whether the lease ends at the end of the call.
    v_call_pids uuid[] := '{}';
    v_call_worker uuid[] := '{}';
    v_call_live boolean[] := '{}';
    v_call_barrier bigint[] := '{}';
    v_call_release boolean[] := '{}';
    -- Answers are buffered: a lease released at the end of the call is reported on each item.
    r_success boolean[] := '{}';
    r_error text[] := '{}';
    r_queue text[] := '{}';
    r_partition text[] := '{}';
    r_released boolean[] := '{}';
    r_dlq boolean[] := '{}';
    r_pid uuid[] := '{}';
    i integer;
    v_ok boolean;
    v_err text;
    v_released boolean;
    v_dlq boolean;
    v_queue text;
    v_pname text;
BEGIN
    FOR i IN 1 .. v_n LOOP
        v_ok := false; v_err := NULL; v_released := false; v_dlq := false; v_queue := NULL; v_pname := NULL;
        v_pid := CASE WHEN p_partition_ids[i] ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                      THEN p_partition_ids[i]::uuid END;
        <<item>>
        BEGIN
            SELECT p.id, p.name AS partition, q.id AS queue_id, q.name AS queue, q.retry_limit INTO v_part
              FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
             WHERE p.id = v_pid;
            IF NOT FOUND THEN
                v_err := 'Message not found';
                EXIT item;
            END IF;
            v_queue := v_part.queue;
            v_pname := v_part.partition;
            SELECT t.msg_offset INTO v_off FROM queen.log_txids t
             WHERE t.partition_id = v_pid AND t.transaction_id = p_txids[i];
            IF NOT FOUND THEN
                v_err := 'Message not found';
                EXIT item;
            END IF;
            SELECT * INTO c FROM queen.log_consumers lc
             WHERE lc.partition_id = v_pid AND lc.consumer_group = p_group
               FOR UPDATE;
            IF NOT FOUND THEN
                v_err := 'Message not delivered to this consumer group';
                EXIT item;
            END IF;
            k := array_position(v_call_pids, v_pid);
            IF k IS NULL THEN
                v_call_pids := v_call_pids || v_pid;
                v_call_worker := v_call_worker || c.worker_id;
                v_call_live := v_call_live || (c.worker_id IS NOT NULL AND c.lease_expires_at IS NOT NULL AND c.lease_expires_at >= v_now);
                v_call_barrier := v_call_barrier || NULL::bigint;
                v_call_release := v_call_release || false;
                k := array_length(v_call_pids, 1);
            END IF;
            IF v_off <= c.committed THEN
                -- Already committed: idempotent, whatever lease it names (a retried transaction's
                -- ack arrives after its lease was released).
                v_ok := true;
                EXIT item;
            END IF;
            IF COALESCE(p_lease_ids[i], '') <> ''
               AND (NOT v_call_live[k] OR v_call_worker[k] IS NULL OR v_call_worker[k]::text <> p_lease_ids[i]) THEN
                v_err := 'Invalid or expired lease';
                EXIT item;
            END IF;
            IF c.batch_end IS NULL OR v_off > c.batch_end THEN
                v_err := 'Message not delivered';
                EXIT item;
            END IF;
            v_ok := true;
            v_barrier := v_call_barrier[k];
            v_to := NULL;
            CASE p_statuses[i]
                WHEN 'completed', 'success' THEN
                    v_to := v_off;
                WHEN 'failed' THEN
                    c.retry_count := CASE WHEN c.retry_offset = v_off THEN c.retry_count + 1 ELSE 1 END;
                    c.retry_offset := v_off;
                    IF c.retry_count > v_part.retry_limit AND v_off = c.committed + 1 AND v_barrier IS NULL THEN
                        v_dlq := true;
                        v_to := v_off;
                    ELSE
                        v_call_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                        v_call_release[k] := true;
                    END IF;
                WHEN 'retry' THEN
                    v_call_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                    v_call_release[k] := true;
                WHEN 'dlq' THEN
                    IF v_off = c.committed + 1 AND v_barrier IS NULL THEN
                        v_dlq := true;
                        v_to := v_off;
                    ELSE
                        -- Earlier messages are still unacknowledged: file it when it reaches the head.
                        c.retry_offset := v_off;
                        c.retry_count := 1073741823;
                        v_call_barrier[k] := LEAST(COALESCE(v_barrier, v_off), v_off);
                        v_call_release[k] := true;
                    END IF;
                ELSE
                    v_ok := false;
                    v_err := 'Unknown status';
                    EXIT item;
            END CASE;
            IF v_dlq THEN
                INSERT INTO queen.dead_letters (queue_id, partition_id, partition_name, consumer_group,
                                                msg_offset, transaction_id, error, retry_count, failed_at)
                VALUES (v_part.queue_id, v_pid, v_part.partition, p_group, v_off, p_txids[i],
                        p_errors[i], c.retry_count, v_now);
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
            UPDATE queen.log_consumers lc
               SET committed = c.committed, worker_id = c.worker_id, lease_expires_at = c.lease_expires_at,
                   lease_acquired_at = c.lease_acquired_at, batch_end = c.batch_end,
                   total_consumed = c.total_consumed, retry_offset = c.retry_offset, retry_count = c.retry_count
             WHERE lc.partition_id = v_pid AND lc.consumer_group = p_group;
        END item;
        r_success := r_success || v_ok;
        r_error := r_error || v_err;
        r_queue := r_queue || v_queue;
        r_partition := r_partition || v_pname;
        r_released := r_released || v_released;
        r_dlq := r_dlq || v_dlq;
        r_pid := r_pid || v_pid;
    END LOOP;

    -- Failed or retried messages end the lease at the end of the call: redelivery from the cursor.
    FOR k IN 1 .. COALESCE(array_length(v_call_pids, 1), 0) LOOP
        IF v_call_release[k] THEN
            UPDATE queen.log_consumers lc
               SET worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL
             WHERE lc.partition_id = v_call_pids[k] AND lc.consumer_group = p_group
               AND lc.worker_id IS NOT NULL AND lc.worker_id = v_call_worker[k];
            IF FOUND THEN
                FOR i IN 1 .. v_n LOOP
                    IF r_pid[i] = v_call_pids[k] AND r_success[i] THEN
                        r_released[i] := true;
                    END IF;
                END LOOP;
            END IF;
        END IF;
    END LOOP;

    FOR i IN 1 .. v_n LOOP
        o_success := r_success[i]; o_error := r_error[i]; o_queue := r_queue[i]; o_partition := r_partition[i];
        o_lease_released := r_released[i]; o_dlq := r_dlq[i];
        RETURN NEXT;
    END LOOP;
END
$$;

-- Extends every live lease held under a lease id to at least now + seconds. An expired lease is
-- not revived.
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
        RETURNING c.lease_expires_at
    )
    SELECT count(*)::integer, max(r.lease_expires_at) FROM renewed r;
END
$$;

-- Creates or overwrites a queue's configuration, and its Default partition.
CREATE OR REPLACE FUNCTION queen.configure_queue_v1(
    p_name text, p_namespace text, p_task text, p_lease_time integer, p_retry_limit integer,
    p_retry_delay integer, p_priority integer, p_delayed_processing integer, p_window_buffer integer,
    p_max_size integer, p_ttl integer, p_retention_enabled boolean, p_retention_seconds integer,
    p_completed_retention_seconds integer, p_encryption_enabled boolean, p_dead_letter_queue boolean,
    p_dlq_after_max_retries boolean, p_max_wait_time_seconds integer, p_min_pop_wait_time integer
) RETURNS TABLE (o_queue_id uuid, o_partition_id uuid)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_qid uuid;
    v_pid uuid;
BEGIN
    INSERT INTO queen.queues AS q (name, namespace, task, lease_time, retry_limit, retry_delay, priority,
        delayed_processing, window_buffer, max_size, ttl, retention_enabled, retention_seconds,
        completed_retention_seconds, encryption_enabled, dead_letter_queue, dlq_after_max_retries,
        max_wait_time_seconds, min_pop_wait_time)
    VALUES (p_name, p_namespace, p_task, p_lease_time, p_retry_limit, p_retry_delay, p_priority,
        p_delayed_processing, p_window_buffer, p_max_size, p_ttl, p_retention_enabled, p_retention_seconds,
        p_completed_retention_seconds, p_encryption_enabled, p_dead_letter_queue, p_dlq_after_max_retries,
        p_max_wait_time_seconds, p_min_pop_wait_time)
    ON CONFLICT (name) DO UPDATE SET
        namespace = EXCLUDED.namespace, task = EXCLUDED.task, lease_time = EXCLUDED.lease_time,
        retry_limit = EXCLUDED.retry_limit, retry_delay = EXCLUDED.retry_delay, priority = EXCLUDED.priority,
        delayed_processing = EXCLUDED.delayed_processing, window_buffer = EXCLUDED.window_buffer,
        max_size = EXCLUDED.max_size, ttl = EXCLUDED.ttl, retention_enabled = EXCLUDED.retention_enabled,
        retention_seconds = EXCLUDED.retention_seconds,
        completed_retention_seconds = EXCLUDED.completed_retention_seconds,
        encryption_enabled = EXCLUDED.encryption_enabled, dead_letter_queue = EXCLUDED.dead_letter_queue,
        dlq_after_max_retries = EXCLUDED.dlq_after_max_retries,
        max_wait_time_seconds = EXCLUDED.max_wait_time_seconds, min_pop_wait_time = EXCLUDED.min_pop_wait_time
    RETURNING q.id INTO v_qid;
    INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
    VALUES (gen_random_uuid(), v_qid, 'Default', -1, date_trunc('second', queen.now()))
    ON CONFLICT (queue_id, name) DO NOTHING;
    SELECT p.id INTO v_pid FROM queen.log_partitions p WHERE p.queue_id = v_qid AND p.name = 'Default';
    o_queue_id := v_qid;
    o_partition_id := v_pid;
    RETURN NEXT;
END
$$;

-- Deletes a queue with its partitions, segments, cursors, dead letters and watermarks (the
-- subscription records stay, keyed by name, as in Queen 0.15).
CREATE OR REPLACE FUNCTION queen.delete_queue_v1(p_name text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH d AS (DELETE FROM queen.queues q WHERE q.name = p_name RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d)
$$;

-- Retention: removes a partition's segments below an offset. Cursors and the partition head stay.
CREATE OR REPLACE FUNCTION queen.drop_segments_v1(p_queue text, p_partition text, p_before bigint)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH d AS (
        DELETE FROM queen.log_segments s
         USING queen.log_partitions p, queen.queues q
         WHERE s.partition_id = p.id AND p.queue_id = q.id
           AND q.name = p_queue AND p.name = p_partition AND s.base_offset < p_before
        RETURNING 1)
    SELECT count(*)::integer FROM d
$$;
