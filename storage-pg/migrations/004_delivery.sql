-- The delivery contract beyond the pop: consumer-group management (seek, delete, subscription).
-- Seek and delete also drop the group's wildcard watermark: the group will read partitions again
-- that were written before the watermark advanced.

-- Moves a group's existing cursors on a queue: to the end, or just after the last message created
-- at or before a timestamp (to the retention start when there is none). Leases end.
CREATE OR REPLACE FUNCTION queen.seek_group_v1(p_group text, p_queue text, p_to_end boolean, p_ts timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH t AS (
        SELECT c.partition_id, p.last_offset
          FROM queen.log_consumers c
          JOIN queen.log_partitions p ON p.id = c.partition_id
          JOIN queen.queues q ON q.id = p.queue_id
         WHERE q.name = p_queue AND c.consumer_group = p_group
           FOR UPDATE OF c
    )
    UPDATE queen.log_consumers c
       SET committed = CASE WHEN p_to_end THEN t.last_offset ELSE COALESCE(
               (SELECT s.end_offset FROM queen.log_segments s
                 WHERE s.partition_id = c.partition_id AND s.created_at <= p_ts
                 ORDER BY s.base_offset DESC LIMIT 1),
               (SELECT s.base_offset - 1 FROM queen.log_segments s
                 WHERE s.partition_id = c.partition_id ORDER BY s.base_offset LIMIT 1),
               t.last_offset) END,
           worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL,
           retry_offset = NULL, retry_count = 0
      FROM t
     WHERE c.partition_id = t.partition_id AND c.consumer_group = p_group;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    DELETE FROM queen.log_watermarks w USING queen.queues q
     WHERE w.queue_id = q.id AND q.name = p_queue AND w.consumer_group = p_group;
    RETURN v_moved;
END
$$;

-- Deletes a group's cursors (on one queue, or on all when p_queue is NULL) and, when asked, its
-- subscription records. Returns (cursors deleted, records deleted).
CREATE OR REPLACE FUNCTION queen.delete_group_v1(p_group text, p_queue text, p_delete_metadata boolean)
RETURNS TABLE (o_cursors integer, o_metadata integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM queen.log_watermarks w USING queen.queues q
     WHERE w.queue_id = q.id AND w.consumer_group = p_group AND (p_queue IS NULL OR q.name = p_queue);
    RETURN QUERY
    WITH d AS (
        DELETE FROM queen.log_consumers c
         USING queen.log_partitions p, queen.queues q
         WHERE c.partition_id = p.id AND p.queue_id = q.id AND c.consumer_group = p_group
           AND (p_queue IS NULL OR q.name = p_queue)
        RETURNING 1),
    m AS (
        DELETE FROM queen.consumer_groups_metadata m
         WHERE p_delete_metadata AND m.consumer_group = p_group AND (p_queue IS NULL OR m.queue_name = p_queue)
        RETURNING 1)
    SELECT (SELECT count(*) FROM d)::integer, (SELECT count(*) FROM m)::integer;
END
$$;

-- Sets the subscription timestamp of every record of a group.
CREATE OR REPLACE FUNCTION queen.update_subscription_v1(p_group text, p_ts timestamptz)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH u AS (
        UPDATE queen.consumer_groups_metadata m SET subscription_timestamp = p_ts
         WHERE m.consumer_group = p_group
        RETURNING 1)
    SELECT count(*)::integer FROM u
$$;

-- Dead letters newest first, each with the segment row holding its message (NULL once retention
-- removed it).
CREATE OR REPLACE FUNCTION queen.dead_letters_v1(
    p_queue text, p_group text, p_partition text, p_from timestamptz, p_to timestamptz,
    p_limit integer, p_offset integer
) RETURNS TABLE (
    o_id bigint, o_partition text, o_partition_id uuid, o_group text, o_offset bigint, o_txid text,
    o_error text, o_retry_count integer, o_failed_at timestamptz,
    o_base bigint, o_end bigint, o_created timestamptz, o_blob bytea, o_total bigint
)
LANGUAGE sql STABLE AS $$
    WITH matching AS (
        SELECT d.*
          FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id
         WHERE q.name = p_queue
           AND (p_group IS NULL OR d.consumer_group = p_group)
           AND (p_partition IS NULL OR d.partition_name = p_partition)
           AND (p_from IS NULL OR d.failed_at >= p_from)
           AND (p_to IS NULL OR d.failed_at <= p_to)
    ), total AS (SELECT count(*) AS n FROM matching)
    SELECT m.id, m.partition_name, m.partition_id, m.consumer_group, m.msg_offset, m.transaction_id,
           m.error, m.retry_count, m.failed_at, s.base_offset, s.end_offset, s.created_at, s.blob, total.n
      FROM matching m
     CROSS JOIN total
      LEFT JOIN LATERAL (
            SELECT s.base_offset, s.end_offset, s.created_at, s.blob
              FROM queen.log_segments s
             WHERE s.partition_id = m.partition_id AND s.base_offset <= m.msg_offset
             ORDER BY s.base_offset DESC LIMIT 1) s ON s.end_offset >= m.msg_offset
     ORDER BY m.id DESC
     LIMIT p_limit OFFSET p_offset
$$;
