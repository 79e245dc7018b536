-- Whole-batch acks (MessageStorage::ack_batch_ends): what ack_v2 does for every message of a batch
-- acked completed in order under its lease, as one guarded cursor write per batch. A batch is
-- committed only while its cursor row is still under the live lease with that batch end, the end
-- is not yet committed and the batch's first message is still stored (retention removes a
-- partition's oldest messages first, so then all of it is); otherwise it is left untouched and the
-- broker acks its items with ack_v2, which answers each. Rows are written in partition-id order,
-- as ack_v2 locks them. Returns the partitions committed.
CREATE OR REPLACE FUNCTION queen.ack_batch_ends_v1(
    p_group text, p_lease uuid, p_partition_ids uuid[], p_ends bigint[], p_first_txids text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := queen.now();
    b record;
BEGIN
    FOR b IN
        SELECT u.pid, u.e, u.tx
          FROM unnest(p_partition_ids, p_ends, p_first_txids) AS u (pid, e, tx)
         ORDER BY u.pid
    LOOP
        RETURN QUERY
        UPDATE queen.log_consumers lc
           SET committed = b.e,
               total_consumed = lc.total_consumed + (b.e - lc.committed),
               retry_offset = CASE WHEN lc.retry_offset <= b.e THEN NULL ELSE lc.retry_offset END,
               retry_count = CASE WHEN lc.retry_offset <= b.e THEN 0 ELSE lc.retry_count END,
               worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL
         WHERE lc.partition_id = b.pid AND lc.consumer_group = p_group
           AND lc.worker_id = p_lease AND lc.lease_expires_at >= v_now
           AND lc.batch_end = b.e AND lc.committed < b.e
           AND EXISTS (SELECT 1 FROM queen.log_txids t
                        WHERE t.partition_id = b.pid AND t.transaction_id = b.tx)
        RETURNING lc.partition_id;
    END LOOP;
END
$$;
