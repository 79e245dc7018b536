-- Deliverability events for every broker on this database (LISTEN queen_event), sent at commit.
-- push_v6 announces appended messages on queen_push; the triggers of migration 009 call these
-- functions for every other change that can make data deliverable, whoever makes it (an ack, a
-- transaction, a seek, a group delete, retention). Payloads are one field per line; names never
-- contain a newline (every route refuses one). PostgreSQL folds identical notifications of one
-- transaction, so a group delete over many partitions sends one `group` line per queue.
--   release\n<queue>\n<partition>\n<group>   a lease ended or changed hands other than by a claim;
--                                            a fifth line `committed` when the cursor reached
--                                            the lease's batch end (the whole batch acked)
--   group\n<queue>\n<group>                  a group's cursor moved back or was deleted
-- This one: a cursor row was updated (release, rewind) or deleted.
CREATE OR REPLACE FUNCTION queen.notify_cursor_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_partition text;
BEGIN
    SELECT q.name, p.name INTO v_queue, v_partition
      FROM queen.log_partitions p
      JOIN queen.queues q ON q.id = p.queue_id
     WHERE p.id = OLD.partition_id;
    IF NOT FOUND THEN
        -- The partition went with its queue in this transaction; the queue trigger tells.
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('queen_event', 'group' || E'\n' || v_queue || E'\n' || OLD.consumer_group);
        RETURN NULL;
    END IF;
    -- A claim sets lease_acquired_at; an ack, nack, retryDelay hold or seek clears it.
    IF OLD.worker_id IS NOT NULL AND NEW.worker_id IS DISTINCT FROM OLD.worker_id
       AND NEW.lease_acquired_at IS NULL THEN
        PERFORM pg_notify('queen_event',
            'release' || E'\n' || v_queue || E'\n' || v_partition || E'\n' || NEW.consumer_group
            || CASE WHEN NEW.committed >= OLD.batch_end THEN E'\ncommitted' ELSE '' END);
    END IF;
    IF NEW.committed < OLD.committed THEN
        PERFORM pg_notify('queen_event', 'group' || E'\n' || v_queue || E'\n' || NEW.consumer_group);
    END IF;
    RETURN NULL;
END
$$;
