-- A page of the ring's reseed walk: partitions with a backlog for the group, claimable or
-- leased, the first p_limit by name after p_after (NULL: from the first). A leased one is tried
-- once and its verdict puts it on the ring's wheel until the lease ends, so a broker that starts
-- (or reconnects) while another broker's consumer holds a lease still learns when that lease
-- ends. Names are COLLATE "C" (migration 021): the keyset walks log_partitions' (queue_id, name)
-- index in bytewise order, so a page costs its own rows, not the queue's.
CREATE OR REPLACE FUNCTION queen.log_pending_partitions_v2(
    p_queue text, p_group text, p_after text, p_limit integer
) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT p.name
      FROM queen.queues q
      JOIN queen.log_partitions p ON p.queue_id = q.id
      LEFT JOIN queen.log_consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
     WHERE q.name = p_queue
       AND (p_after IS NULL OR p.name > p_after)
       AND ((c.partition_id IS NULL AND p.last_offset >= 0) OR p.last_offset > c.committed)
     ORDER BY p.name
     LIMIT p_limit
$$;
