-- Step 3: where a never-seen (partition, group) cursor starts. The durable subscription record
-- first, then the pop-carried intent, then -1. __QUEUE_MODE__ never skips backlog.
CREATE OR REPLACE FUNCTION queen.seed_cursor_v1(
    p_pid uuid, p_queue_name text, p_group text,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_last bigint;
    v_ts timestamptz;
    v_base bigint;
BEGIN
    SELECT p.last_offset INTO v_last FROM queen.log_partitions p WHERE p.id = p_pid;
    IF p_group = '__QUEUE_MODE__' THEN
        RETURN -1;
    END IF;
    SELECT m.subscription_timestamp INTO v_ts
      FROM queen.consumer_groups_metadata m
     WHERE m.queue_name = p_queue_name AND m.consumer_group = p_group;
    IF FOUND THEN
        IF v_ts IS NULL THEN
            RETURN -1;
        END IF;
    ELSIF p_sub_from IS NOT NULL THEN
        v_ts := p_sub_from;
    ELSIF p_sub_now OR p_sub_mode = 'new' THEN
        RETURN v_last;
    ELSE
        RETURN -1;
    END IF;
    -- Just before the first segment at or after the timestamp: a forward walk from the
    -- retention start (created_at is monotone in base_offset), never from offset 0.
    SELECT s.base_offset INTO v_base
      FROM queen.log_segments s
     WHERE s.partition_id = p_pid AND s.created_at >= v_ts
     ORDER BY s.base_offset
     LIMIT 1;
    RETURN COALESCE(v_base - 1, v_last);
END
$$;
