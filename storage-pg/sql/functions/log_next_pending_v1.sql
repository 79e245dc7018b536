-- When something next becomes deliverable to a group in these queues: now when a partition with
-- a backlog is claimable; else the earliest end of the leases (or retryDelay holds) over the
-- backlogs; NULL when nothing has a backlog. The parked legacy and discovery pops sleep until
-- then at the latest. STABLE: both statements read one snapshot.
CREATE OR REPLACE FUNCTION queen.log_next_pending_v1(p_queues text[], p_group text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz := queen.now();
BEGIN
    IF EXISTS (
        SELECT 1
          FROM queen.queues q
          JOIN queen.log_partitions p ON p.queue_id = q.id
          LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
         WHERE q.name = ANY (p_queues)
           AND ((c.partition_id IS NULL AND p.last_offset >= 0)
                OR (p.last_offset > c.committed
                    AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now))))
    THEN
        RETURN v_now;
    END IF;
    -- A lease holds while lease_expires_at >= now (the claim tests <): free one microsecond on.
    RETURN (
        SELECT min(c.lease_expires_at) + interval '1 microsecond'
          FROM queen.queues q
          JOIN queen.log_partitions p ON p.queue_id = q.id
          JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
         WHERE q.name = ANY (p_queues)
           AND p.last_offset > c.committed);
END
$$;
