-- Deletes a queue with its partitions, segments, cursors, dead letters and watermarks (the
-- subscription records stay, keyed by name, as in Queen 0.15). The queue row is locked first, so
-- no push can create a partition meanwhile (that takes a key-share lock on it); the partitions
-- are deleted after any push holding one commits, and only then their transactionId rows (which
-- have no foreign key to cascade), by a statement that sees that push's rows.
CREATE OR REPLACE FUNCTION queen.delete_queue_v1(p_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_qid uuid;
    v_pids uuid[];
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    WITH gone AS (DELETE FROM queen.log_partitions p WHERE p.queue_id = v_qid RETURNING p.id)
    SELECT COALESCE(array_agg(g.id), '{}') INTO v_pids FROM gone g;
    DELETE FROM queen.log_txids t USING unnest(v_pids) AS u (pid) WHERE t.partition_id = u.pid;
    DELETE FROM queen.queues q WHERE q.id = v_qid;
    RETURN true;
END
$$;
