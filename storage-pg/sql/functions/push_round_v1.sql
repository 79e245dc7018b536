-- A round of concurrent push requests' groups, set-based: one statement of each kind for the whole
-- round (lock the partitions, insert every transactionId, insert every segment, move every
-- partition's head, announce) where push_v6 runs all of them once per group. Group i is
-- (p_queues[i], p_partitions[i], p_blobs[i], p_sealed[i]) with the transactionIds and message
-- ids p_starts[i]..p_ends[i] (1-based, inclusive) of p_txids / p_message_ids. Several groups of
-- one partition take consecutive offsets in group order.
--
-- Only the common case is taken here; for anything else it writes nothing and answers no row,
-- and the broker sends the round as push_v6 per group, which answers every case:
-- - a queue or partition that does not exist yet (created by push_v6 in the lock order: creating
--   them here before the locks could deadlock against a push that holds a lock and creates);
-- - a queue with maxSize (its pushes serialize on the queue row and count its backlog);
-- - plaintext for a queue with encryptionEnabled (push_v6 refuses it with QE001).
-- A transactionId already stored fails the statement with unique_violation on log_txids_pkey,
-- as push_v6 with p_expect_new does, and the broker sends the requests alone to answer it.
--
-- Partition rows are locked in byte order of (queue, partition), the order the broker sorts
-- every push's groups in, so a round and any other push never deadlock. created_at and
-- last_write_at follow push_v6's rules (monotone per partition; never before this transaction).
-- Answers one row per group: its number, partition id, first offset and count.
CREATE OR REPLACE FUNCTION queen.push_round_v1(
    p_queues text[], p_partitions text[], p_blobs bytea[], p_sealed boolean[],
    p_starts integer[], p_ends integer[], p_txids text[], p_message_ids uuid[]
) RETURNS TABLE (o_i bigint, o_partition_id uuid, o_offset bigint, o_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + (queen.now() - now());
    v_wanted integer;
    v_q text[];
    v_p text[];
    v_pid uuid[];
    v_last bigint[];
    v_newest_at timestamptz[];
    v_newest_offset bigint[];
BEGIN
    IF EXISTS (
        SELECT 1
          FROM unnest(p_queues, p_sealed) AS u (queue, sealed)
          LEFT JOIN queen.queues q ON q.name = u.queue
         WHERE q.id IS NULL
            OR COALESCE(q.max_size, 0) > 0
            OR (COALESCE(q.encryption_enabled, false) AND u.sealed IS NOT NULL AND NOT u.sealed)
    ) THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_wanted
      FROM (SELECT DISTINCT u.queue, u.part FROM unnest(p_queues, p_partitions) AS u (queue, part)) w;
    -- The lock rows are taken in the sorted order (LockRows runs above the sort).
    SELECT array_agg(l.queue ORDER BY l.ord), array_agg(l.part ORDER BY l.ord),
           array_agg(l.id ORDER BY l.ord), array_agg(l.last_offset ORDER BY l.ord),
           array_agg(l.newest_at ORDER BY l.ord), array_agg(l.newest_offset ORDER BY l.ord)
      INTO v_q, v_p, v_pid, v_last, v_newest_at, v_newest_offset
      FROM (SELECT k.queue, k.part, k.id, k.last_offset, k.newest_at, k.newest_offset,
                   row_number() OVER () AS ord
              FROM (SELECT q.name AS queue, p.name AS part, p.id, p.last_offset, p.newest_at,
                           p.newest_offset
                      FROM queen.log_partitions p
                      JOIN queen.queues q ON q.id = p.queue_id
                     WHERE (q.name, p.name) IN (SELECT u.queue, u.part
                                                  FROM unnest(p_queues, p_partitions) AS u (queue, part))
                     ORDER BY q.name COLLATE "C", p.name COLLATE "C"
                       FOR NO KEY UPDATE OF p) k) l;
    IF COALESCE(array_length(v_pid, 1), 0) <> v_wanted THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH groups AS (
        SELECT g.i, l.id AS pid, g.blob, g.s, g.e, (g.e - g.s + 1)::bigint AS n,
               l.last_offset + 1 + COALESCE(sum(g.e - g.s + 1) OVER (
                   PARTITION BY l.id ORDER BY g.i
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS base
          FROM unnest(p_queues, p_partitions, p_blobs, p_starts, p_ends)
               WITH ORDINALITY AS g (queue, part, blob, s, e, i)
          JOIN unnest(v_q, v_p, v_pid, v_last) AS l (queue, part, id, last_offset)
            ON l.queue = g.queue AND l.part = g.part
    ), parts AS (
        -- created_at never below the partition's newest segment (a push that began earlier may
        -- have taken the lock first): its time is on the locked row while the row's
        -- newest_offset is its head (migration 031), else read from the segment (push_v6 says
        -- when).
        SELECT l.id AS pid,
               GREATEST(v_now, CASE WHEN l.newest_offset = l.last_offset THEN l.newest_at
                                    ELSE (SELECT s.created_at FROM queen.log_segments s
                                           WHERE s.partition_id = l.id
                                           ORDER BY s.base_offset DESC LIMIT 1) END) AS created,
               (SELECT sum(g.n) FROM groups g WHERE g.pid = l.id) AS total
          FROM unnest(v_pid, v_last, v_newest_at, v_newest_offset)
               AS l (id, last_offset, newest_at, newest_offset)
    ), txids AS (
        INSERT INTO queen.log_txids (partition_id, transaction_id, msg_offset, message_id)
        SELECT g.pid, t.tx, g.base + t.k - 1, t.mid
          FROM groups g
         CROSS JOIN LATERAL unnest(p_txids[g.s:g.e], p_message_ids[g.s:g.e])
               WITH ORDINALITY AS t (tx, mid, k)
    ), segments AS (
        INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, msg_count,
                                        created_at, blob)
        SELECT g.pid, g.base, g.base + g.n - 1, g.n, p.created, g.blob
          FROM groups g JOIN parts p ON p.pid = g.pid
    ), heads AS (
        UPDATE queen.log_partitions lp
           SET last_offset = lp.last_offset + p.total,
               -- Never before this transaction began: partitions/changed's safeTime relies on it.
               last_write_at = date_trunc('second', GREATEST(p.created, queen.now())),
               oldest_at = COALESCE(lp.oldest_at, p.created),
               newest_at = p.created,
               newest_offset = lp.last_offset + p.total
          FROM parts p
         WHERE lp.id = p.pid
    )
    SELECT g.i, g.pid, g.base, g.n FROM groups g ORDER BY g.i;
    -- Delivered at commit to every broker listening: their parked consumers wake at once.
    PERFORM pg_notify('queen_push', u.queue || E'\n' || u.part || E'\n' || sum(u.e - u.s + 1))
       FROM unnest(p_queues, p_partitions, p_starts, p_ends) AS u (queue, part, s, e)
      GROUP BY u.queue, u.part;
END
$$;
