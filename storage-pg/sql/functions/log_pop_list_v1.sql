-- log_pop_list_v1: candidate names from the broker's hot-list ring, one transaction.
CREATE OR REPLACE FUNCTION queen.log_pop_list_v1(
    p_queue text, p_group text, p_names text[], p_worker uuid, p_batch integer,
    p_max_partitions integer, p_auto_ack boolean, p_lease_seconds integer, p_skip_window boolean,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queen.queues;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT n, NULL::uuid, 'missing'::text, NULL::timestamptz, NULL::bigint, NULL::bigint,
            NULL::integer, NULL::timestamptz, NULL::bigint, NULL::integer, NULL::integer, NULL::integer,
            NULL::timestamptz, NULL::bytea
          FROM unnest(p_names) AS n;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM queen.log_pop_loop_v1(
        q, p_group, p_names, array_fill(NULL::uuid, ARRAY[COALESCE(array_length(p_names, 1), 0)]),
        p_worker, p_batch, p_max_partitions, p_auto_ack, p_lease_seconds, p_skip_window,
        p_sub_mode, p_sub_from, p_sub_now, queen.now());
END
$$;
