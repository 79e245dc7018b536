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
