CREATE OR REPLACE FUNCTION queen.log_pending_partitions_v2(
    p_queue text, p_group text, p_after text, p_limit integer
) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_queue_id uuid;
BEGIN
    SELECT q.id INTO v_queue_id FROM queen.queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT p.name
      FROM queen.log_partitions p
      LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
     WHERE p.queue_id = v_queue_id
       AND (p_after IS NULL OR p.name > p_after)
       AND ((c.partition_id IS NULL AND p.last_offset >= 0) OR p.last_offset > c.committed)
     ORDER BY p.name
     LIMIT p_limit;
END
$$;
