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
