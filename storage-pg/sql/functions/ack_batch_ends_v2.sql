-- Whole-batch acks of several leases, of any groups (MessageStorage::ack_batch_ends_many): what
-- ack_batch_ends_v1 does for each batch, as one set-based write instead of a statement per batch,
-- so the acks a broker coalesced across groups cost one statement. The arrays are one entry per
-- batch. A batch is committed only while its cursor row is still under the live lease with that
-- batch end, the end is not yet committed and the batch's first message is still stored;
-- otherwise it is left untouched and the broker acks its items with ack_v2. Rows are locked in
-- (partition id, group) order first (ORDER BY under FOR UPDATE locks in the sorted order), as
-- ack_v2 and v1 lock them, so concurrent acks do not deadlock. Returns the 1-based positions of
-- the batches committed. A batch listed twice commits once.
CREATE OR REPLACE FUNCTION queen.ack_batch_ends_v2(
    p_groups text[], p_leases uuid[], p_partition_ids uuid[], p_ends bigint[], p_first_txids text[]
) RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := queen.now();
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT lc.partition_id, lc.consumer_group, u.e, u.i::integer AS i
          FROM unnest(p_groups, p_leases, p_partition_ids, p_ends, p_first_txids)
               WITH ORDINALITY AS u (g, lease, pid, e, tx, i)
          JOIN queen.log_consumers lc
            ON lc.partition_id = u.pid AND lc.consumer_group = u.g
         WHERE lc.worker_id = u.lease AND lc.lease_expires_at >= v_now
           AND lc.batch_end = u.e AND lc.committed < u.e
           AND EXISTS (SELECT 1 FROM queen.log_txids t
                        WHERE t.partition_id = u.pid AND t.transaction_id = u.tx)
         ORDER BY lc.partition_id, lc.consumer_group
           FOR UPDATE OF lc
    )
    UPDATE queen.log_consumers lc
       SET committed = due.e,
           total_consumed = lc.total_consumed + (due.e - lc.committed),
           retry_offset = CASE WHEN lc.retry_offset <= due.e THEN NULL ELSE lc.retry_offset END,
           retry_count = CASE WHEN lc.retry_offset <= due.e THEN 0 ELSE lc.retry_count END,
           worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL
      FROM due
     WHERE lc.partition_id = due.partition_id AND lc.consumer_group = due.consumer_group
    RETURNING due.i;
END
$$;
