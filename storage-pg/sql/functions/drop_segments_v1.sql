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
