-- One (queue, partition) group of a push request. The partition row's lock is held to commit, so
-- offsets are allocated in commit order (no commit-order skip). Duplicates by (partition,
-- transactionId) answer the original message id; when any item is a duplicate nothing is
-- appended and every other item answers 'retry': the broker rebuilds the blob without the
-- duplicates and calls again (a duplicate stays one, so each call has fewer items). The common
-- case, no duplicates, is one call.
-- maxSize: a push that would take the queue's backlog past it is refused whole: every item
-- answers 'full' with the cap and the backlog it met (o_max_size, o_backlog).
-- p_created: the time the push was accepted, when it is replayed later (NULL: now).
-- p_sealed: every payload of the blob is encrypted by the broker. A queue with encryptionEnabled
-- refuses anything else (SQLSTATE QE001, the queue's name as the message): read here, in the
-- push's own transaction, so a broker with a stale view of the queue cannot store plaintext.
-- NULL: stored as it is (a requeue re-pushes a message admitted under the options of its time).
-- p_expect_new: the transactionIds are expected new (the common case): their rows are inserted
-- plainly, and a duplicate raises unique_violation (23505, on log_txids_pkey), which the broker
-- answers by calling again with false. False: inserted ON CONFLICT DO NOTHING, so duplicates are
-- answered. The plain insert saves the separate conflict check of every row (a fifth of all
-- samples in the batch-1000 profile, docs/benchmarks.md).
-- A push stored whole answers one row, not one per item: status 'queued', o_offset the first
-- item's offset, o_backlog the item count; item k (from 0) has offset o_offset + k and the
-- message id it was given. (push_v5 answered every item: a thousand rows built, sent and read
-- per batch-1000 push.) Any other outcome answers every item in order.
-- Committed pushes are announced on queen_push (`queue\npartition\ncount`): every broker's
-- parked consumers wake at once.
-- Sections, in order: the queue row (made on first use; locked first when
-- capped, then maxSize checked); the partition row, locked for the push's offsets; the
-- transactionId rows inserted (a duplicate answers every item and stores nothing); the segment
-- and the partition's head; the notification; the answer.
CREATE OR REPLACE FUNCTION queen.push_v6(
    p_queue text, p_partition text, p_txids text[], p_message_ids uuid[], p_blob bytea,
    p_created timestamptz, p_sealed boolean, p_expect_new boolean
) RETURNS TABLE (
    o_status text, o_message_id uuid, o_partition_id uuid, o_offset bigint,
    o_max_size integer, o_backlog bigint
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_qid uuid;
    v_pid uuid;
    v_last bigint;
    v_newest_at timestamptz;
    v_newest_offset bigint;
    v_n integer := COALESCE(array_length(p_txids, 1), 0);
    v_created timestamptz;
    v_cap integer := 0;
    v_backlog bigint;
    v_encrypted boolean := false;
    v_inserted bigint;
BEGIN
    SELECT q.id, q.max_size, q.encryption_enabled INTO v_qid, v_cap, v_encrypted
      FROM queen.queues q WHERE q.name = p_queue;
    IF COALESCE(v_encrypted, false) AND p_sealed IS NOT NULL AND NOT p_sealed THEN
        RAISE EXCEPTION USING ERRCODE = 'QE001', MESSAGE = p_queue;
    END IF;
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
    SELECT p.id, p.last_offset, p.newest_at, p.newest_offset
      INTO v_pid, v_last, v_newest_at, v_newest_offset
      FROM queen.log_partitions p
     WHERE p.queue_id = v_qid AND p.name = p_partition
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
        VALUES (gen_random_uuid(), v_qid, p_partition, -1, date_trunc('second', queen.now()))
        ON CONFLICT (queue_id, name) DO NOTHING;
        SELECT p.id, p.last_offset, p.newest_at, p.newest_offset
          INTO v_pid, v_last, v_newest_at, v_newest_offset
          FROM queen.log_partitions p
         WHERE p.queue_id = v_qid AND p.name = p_partition
           FOR NO KEY UPDATE;
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- Dedup in one pass: the transactionId rows are inserted first, and a conflict is a
    -- duplicate (the partition lock serializes every push of this partition, so nothing else can
    -- insert here meanwhile). The rare push that meets one takes its own rows back and answers.
    -- A separate probe cost as much as the insert again (and, planned as a filter over the
    -- partition's rows, grew with the partition: 75% of PostgreSQL's time in the profile).
    IF p_expect_new THEN
        INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
        SELECT v_pid, u.tx, v_last + u.ord, u.mid
          FROM unnest(p_txids, p_message_ids) WITH ORDINALITY AS u (tx, mid, ord);
        v_inserted := v_n;
    ELSE
        INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
        SELECT v_pid, u.tx, v_last + u.ord, u.mid
          FROM unnest(p_txids, p_message_ids) WITH ORDINALITY AS u (tx, mid, ord)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_inserted = ROW_COUNT;
    END IF;
    IF v_inserted < v_n THEN
        PERFORM queen.push_take_back_txids_v1(v_pid, v_last, p_txids);
        RETURN QUERY
            SELECT CASE WHEN t.message_id IS NULL THEN 'retry' ELSE 'duplicate' END,
                   COALESCE(t.message_id, u.mid), v_pid, t.msg_offset, NULL::integer, NULL::bigint
              FROM unnest(p_txids, p_message_ids) WITH ORDINALITY AS u (tx, mid, ord)
              LEFT JOIN LATERAL (SELECT x.message_id, x.msg_offset FROM queen.log_txids x
                                  WHERE x.partition_id = v_pid AND x.transaction_id = u.tx) t ON true
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
            PERFORM queen.push_take_back_txids_v1(v_pid, v_last, p_txids);
            RETURN QUERY
                SELECT 'full'::text, u.mid, v_pid, NULL::bigint, v_cap, v_backlog
                  FROM unnest(p_message_ids) WITH ORDINALITY AS u (mid, ord)
                 ORDER BY u.ord;
            RETURN;
        END IF;
    END IF;
    -- created_at must be monotone in base_offset (the window probe and the delay filter rely on
    -- it), but a push that began earlier may take the lock later: never go below the newest. A
    -- push drained from a broker's file buffer brings the time it was accepted (p_created). The
    -- newest segment's time is on the locked row while the row's newest_offset is its head
    -- (migration 031); otherwise (a partition last written before it, or by a push that does not
    -- keep the columns) it is read from the segment.
    IF v_newest_offset IS DISTINCT FROM v_last THEN
        SELECT s.created_at INTO v_newest_at
          FROM queen.log_segments s
         WHERE s.partition_id = v_pid ORDER BY s.base_offset DESC LIMIT 1;
    END IF;
    v_created := GREATEST(COALESCE(p_created, clock_timestamp() + (queen.now() - now())), v_newest_at);
    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
    VALUES (v_pid, v_last + 1, v_last + v_n, v_n, v_created, p_blob);
    UPDATE queen.log_partitions p
       SET last_offset = v_last + v_n,
           -- Never before this transaction began, even for a push drained from a file buffer
           -- with the time it was accepted: partitions/changed's safeTime relies on it.
           last_write_at = date_trunc('second', GREATEST(v_created, queen.now())),
           oldest_at = COALESCE(p.oldest_at, v_created),
           newest_at = v_created,
           newest_offset = v_last + v_n
     WHERE p.id = v_pid;
    -- Delivered at commit to every broker listening: their parked consumers wake at once
    -- instead of at the next ring reseed.
    PERFORM pg_notify('queen_push', p_queue || E'\n' || p_partition || E'\n' || v_n);
    o_status := 'queued'; o_message_id := NULL; o_partition_id := v_pid; o_offset := v_last + 1;
    o_max_size := NULL; o_backlog := v_n;
    RETURN NEXT;
END
$$;
