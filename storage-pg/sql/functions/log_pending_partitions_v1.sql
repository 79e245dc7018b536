-- The ring's reseed: partitions with a backlog for the group, claimable or leased. A leased one
-- is tried once and its verdict puts it on the ring's wheel until the lease ends, so a broker
-- that starts (or reconnects) while another broker's consumer holds a lease still learns when
-- that lease ends.
CREATE OR REPLACE FUNCTION queen.log_pending_partitions_v1(p_queue text, p_group text, p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT p.name
      FROM queen.queues q
      JOIN queen.log_partitions p ON p.queue_id = q.id
      LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
     WHERE q.name = p_queue
       AND ((c.partition_id IS NULL AND p.last_offset >= 0) OR p.last_offset > c.committed)
     ORDER BY p.name
     LIMIT p_limit
$$;
