-- Deletes a queue with its partitions, segments, cursors, dead letters and watermarks (the
-- subscription records stay, keyed by name, as in Queen 0.15).
CREATE OR REPLACE FUNCTION queen.delete_queue_v1(p_name text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH d AS (DELETE FROM queen.queues q WHERE q.name = p_name RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d)
$$;
