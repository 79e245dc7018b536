-- log_pop_specific_v2: one named partition. A VOLATILE plpgsql function that runs the claim first
-- and resolves the reported partitionId afterwards, in a later command of the same function, whose
-- snapshot is at least as new as anything the claim saw. The previous shape resolved it in the
-- outer statement, under a snapshot taken before the claim: a pop racing the commit of the push
-- that created the partition delivered a leased batch whose messages carried partitionId "".
CREATE OR REPLACE FUNCTION queen.log_pop_specific_v2(
    p_queue text, p_partition text, p_group text, p_worker uuid, p_batch integer,
    p_auto_ack boolean, p_lease_seconds integer,
    p_sub_mode text, p_sub_from timestamptz, p_sub_now boolean, p_conflation boolean
) RETURNS TABLE (
    o_partition text, o_partition_id uuid,
    o_kind text, o_until timestamptz, o_first bigint, o_last bigint, o_attempt integer,
    o_lease_exp timestamptz, o_base bigint, o_start integer, o_take integer, o_count integer,
    o_created timestamptz, o_blob bytea
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queen.queues;
    v_reported uuid;
    v_took boolean := false;
    r record;
    v_rows queen.log_pop_row_v1[] := '{}';
    v_row queen.log_pop_row_v1;
BEGIN
    SELECT * INTO q FROM queen.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        o_partition := p_partition; o_kind := 'missing';
        RETURN NEXT;
        RETURN;
    END IF;
    FOR r IN SELECT * FROM queen.log_pop_loop_v2(
        q, p_group, ARRAY[p_partition], ARRAY[NULL::uuid], p_worker, p_batch, 1, p_auto_ack,
        p_lease_seconds, false, p_sub_mode, p_sub_from, p_sub_now, queen.now(), p_conflation)
    LOOP
        v_took := v_took OR r.o_kind IN ('took', 'took_all');
        v_rows := v_rows || ROW(r.o_partition, r.o_partition_id, r.o_kind, r.o_until, r.o_first, r.o_last,
            r.o_attempt, r.o_lease_exp, r.o_base, r.o_start, r.o_take, r.o_count, r.o_created, r.o_blob)::queen.log_pop_row_v1;
    END LOOP;
    IF v_took THEN
        SELECT p.id INTO v_reported FROM queen.log_partitions p
         WHERE p.queue_id = q.id AND p.name = p_partition;
    END IF;
    FOREACH v_row IN ARRAY v_rows LOOP
        o_partition := v_row.partition; o_partition_id := COALESCE(v_reported, v_row.partition_id);
        o_kind := v_row.kind; o_until := v_row.until_at; o_first := v_row.first_offset;
        o_last := v_row.last_offset; o_attempt := v_row.attempt; o_lease_exp := v_row.lease_exp;
        o_base := v_row.base_offset; o_start := v_row.start_idx; o_take := v_row.take;
        o_count := v_row.msg_count; o_created := v_row.created_at; o_blob := v_row.blob;
        RETURN NEXT;
    END LOOP;
END
$$;
