-- Creates or overwrites a queue's configuration, and its Default partition.
CREATE OR REPLACE FUNCTION queen.configure_queue_v1(
    p_name text, p_namespace text, p_task text, p_lease_time integer, p_retry_limit integer,
    p_retry_delay integer, p_priority integer, p_delayed_processing integer, p_window_buffer integer,
    p_max_size integer, p_ttl integer, p_retention_enabled boolean, p_retention_seconds integer,
    p_completed_retention_seconds integer, p_encryption_enabled boolean, p_dead_letter_queue boolean,
    p_dlq_after_max_retries boolean, p_max_wait_time_seconds integer, p_min_pop_wait_time integer
) RETURNS TABLE (o_queue_id uuid, o_partition_id uuid)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_qid uuid;
    v_pid uuid;
BEGIN
    INSERT INTO queen.queues AS q (name, namespace, task, lease_time, retry_limit, retry_delay, priority,
        delayed_processing, window_buffer, max_size, ttl, retention_enabled, retention_seconds,
        completed_retention_seconds, encryption_enabled, dead_letter_queue, dlq_after_max_retries,
        max_wait_time_seconds, min_pop_wait_time)
    VALUES (p_name, p_namespace, p_task, p_lease_time, p_retry_limit, p_retry_delay, p_priority,
        p_delayed_processing, p_window_buffer, p_max_size, p_ttl, p_retention_enabled, p_retention_seconds,
        p_completed_retention_seconds, p_encryption_enabled, p_dead_letter_queue, p_dlq_after_max_retries,
        p_max_wait_time_seconds, p_min_pop_wait_time)
    ON CONFLICT (name) DO UPDATE SET
        namespace = EXCLUDED.namespace, task = EXCLUDED.task, lease_time = EXCLUDED.lease_time,
        retry_limit = EXCLUDED.retry_limit, retry_delay = EXCLUDED.retry_delay, priority = EXCLUDED.priority,
        delayed_processing = EXCLUDED.delayed_processing, window_buffer = EXCLUDED.window_buffer,
        max_size = EXCLUDED.max_size, ttl = EXCLUDED.ttl, retention_enabled = EXCLUDED.retention_enabled,
        retention_seconds = EXCLUDED.retention_seconds,
        completed_retention_seconds = EXCLUDED.completed_retention_seconds,
        encryption_enabled = EXCLUDED.encryption_enabled, dead_letter_queue = EXCLUDED.dead_letter_queue,
        dlq_after_max_retries = EXCLUDED.dlq_after_max_retries,
        max_wait_time_seconds = EXCLUDED.max_wait_time_seconds, min_pop_wait_time = EXCLUDED.min_pop_wait_time
    RETURNING q.id INTO v_qid;
    INSERT INTO queen.log_partitions (id, queue_id, name, last_offset, last_write_at)
    VALUES (gen_random_uuid(), v_qid, 'Default', -1, date_trunc('second', queen.now()))
    ON CONFLICT (queue_id, name) DO NOTHING;
    SELECT p.id INTO v_pid FROM queen.log_partitions p WHERE p.queue_id = v_qid AND p.name = 'Default';
    o_queue_id := v_qid;
    o_partition_id := v_pid;
    RETURN NEXT;
END
$$;
