-- Removes a partition's segments below an offset, whatever the rules say (tests and the
-- simulation's driver use it to make retention gaps). Cursors and the partition head stay.
CREATE OR REPLACE FUNCTION queen.drop_segments_v1(p_queue text, p_partition text, p_before bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_pid uuid;
    v_n integer;
BEGIN
    SELECT p.id INTO v_pid FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
     WHERE q.name = p_queue AND p.name = p_partition
       FOR NO KEY UPDATE OF p;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM queen.log_segments s WHERE s.partition_id = v_pid AND s.base_offset < p_before;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    UPDATE queen.log_partitions p
       SET oldest_at = (SELECT s.created_at FROM queen.log_segments s
                         WHERE s.partition_id = v_pid ORDER BY s.base_offset LIMIT 1)
     WHERE p.id = v_pid;
    RETURN v_n;
END
$$;
