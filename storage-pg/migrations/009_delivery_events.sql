-- Deliverability events for every broker on this database (LISTEN queen_event), sent at commit.
-- push_v1 already announces appended messages on queen_push. These triggers announce every
-- other change that can make data deliverable, whoever makes it (an ack route, a transaction, a
-- seek, a group delete, retention): written once here, the brokers need not remember to.
-- Payloads are one field per line; names never contain a newline (every route refuses one).
--   release\n<queue>\n<partition>\n<group>   a lease ended or changed hands other than by a claim
--   group\n<queue>\n<group>                  a group's cursor moved back, or its cursor or
--                                            subscription record was deleted or changed
--   queue\n<queue>                           a queue was created, configured or deleted
-- PostgreSQL folds identical notifications of one transaction, so a group delete over many
-- partitions sends one `group` line per queue.

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
            'release' || E'\n' || v_queue || E'\n' || v_partition || E'\n' || NEW.consumer_group);
    END IF;
    IF NEW.committed < OLD.committed THEN
        PERFORM pg_notify('queen_event', 'group' || E'\n' || v_queue || E'\n' || NEW.consumer_group);
    END IF;
    RETURN NULL;
END
$$;

-- The WHEN clause is evaluated without calling the function, so a pop's own cursor update (a
-- claim) costs one comparison.
DROP TRIGGER IF EXISTS log_consumers_released ON queen.log_consumers;
CREATE TRIGGER log_consumers_released
    AFTER UPDATE ON queen.log_consumers
    FOR EACH ROW
    WHEN ((OLD.worker_id IS NOT NULL AND NEW.worker_id IS DISTINCT FROM OLD.worker_id
           AND NEW.lease_acquired_at IS NULL)
          OR NEW.committed < OLD.committed)
    EXECUTE FUNCTION queen.notify_cursor_event();

DROP TRIGGER IF EXISTS log_consumers_deleted ON queen.log_consumers;
CREATE TRIGGER log_consumers_deleted
    AFTER DELETE ON queen.log_consumers
    FOR EACH ROW
    EXECUTE FUNCTION queen.notify_cursor_event();

CREATE OR REPLACE FUNCTION queen.notify_subscription_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('queen_event', 'group' || E'\n' || OLD.queue_name || E'\n' || OLD.consumer_group);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS consumer_groups_metadata_changed ON queen.consumer_groups_metadata;
CREATE TRIGGER consumer_groups_metadata_changed
    AFTER UPDATE ON queen.consumer_groups_metadata
    FOR EACH ROW
    WHEN (OLD.subscription_timestamp IS DISTINCT FROM NEW.subscription_timestamp)
    EXECUTE FUNCTION queen.notify_subscription_event();

DROP TRIGGER IF EXISTS consumer_groups_metadata_deleted ON queen.consumer_groups_metadata;
CREATE TRIGGER consumer_groups_metadata_deleted
    AFTER DELETE ON queen.consumer_groups_metadata
    FOR EACH ROW
    EXECUTE FUNCTION queen.notify_subscription_event();

CREATE OR REPLACE FUNCTION queen.notify_queue_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('queen_event',
        'queue' || E'\n' || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS queues_changed ON queen.queues;
CREATE TRIGGER queues_changed
    AFTER INSERT OR UPDATE OR DELETE ON queen.queues
    FOR EACH ROW
    EXECUTE FUNCTION queen.notify_queue_event();

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

DROP FUNCTION IF EXISTS queen.log_has_pending_v1(text, text);

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
