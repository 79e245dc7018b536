-- Whole-batch acks of several leases, of any groups (MessageStorage::ack_batch_ends_many): what
-- ack_batch_ends_v1 does for each batch, in one call, so the acks a broker coalesced across groups
-- cost one round trip. The arrays are one entry per batch. A batch is committed only while its
-- cursor row is still under the live lease with that batch end, the end is not yet committed and
-- the batch's first message is still stored; otherwise it is left untouched and the broker acks
-- its items with ack_v2. Rows are written (so locked) in (partition id, group) order, as ack_v2
-- and v1 lock them, so concurrent acks do not deadlock. Returns the 1-based positions of the
-- batches committed. A batch listed twice commits once (its first position).
-- One primary-key write per batch, not one set-based statement: a session keeps the plan it made
-- while log_consumers was a page or two (a fresh database, or one analyzed while empty) until the
-- next ANALYZE, and for the set-based join that was a hash join over a sequential scan of every
-- cursor row (43 ms a call at 200k cursors against 0.1 ms); with sequential scans off, over a
-- full index scan (0.3-0.4 s), and with `= ANY` bounds added, over a scan bounded by the group
-- alone. A write by both key columns steps on them in every plan (indexes pkey and 022).
-- enable_seqscan off as in log_pop_v2; jit off because a statement left with no index path
-- (queen.now()'s read of queen.clock) then costs past jit_above_cost and was compiled at every
-- call (16-20 ms).
CREATE OR REPLACE FUNCTION queen.ack_batch_ends_v2(
    p_groups text[], p_leases uuid[], p_partition_ids uuid[], p_ends bigint[], p_first_txids text[]
) RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := queen.now();
    b record;
BEGIN
    FOR b IN
        SELECT u.g, u.lease, u.pid, u.e, u.tx, u.i::integer AS i
          FROM unnest(p_groups, p_leases, p_partition_ids, p_ends, p_first_txids)
               WITH ORDINALITY AS u (g, lease, pid, e, tx, i)
         ORDER BY u.pid, u.g, u.i
    LOOP
        UPDATE queen.log_consumers lc
           SET committed = b.e,
               total_consumed = lc.total_consumed + (b.e - lc.committed),
               retry_offset = CASE WHEN lc.retry_offset <= b.e THEN NULL ELSE lc.retry_offset END,
               retry_count = CASE WHEN lc.retry_offset <= b.e THEN 0 ELSE lc.retry_count END,
               worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL
         WHERE lc.partition_id = b.pid AND lc.consumer_group = b.g
           AND lc.worker_id = b.lease AND lc.lease_expires_at >= v_now
           AND lc.batch_end = b.e AND lc.committed < b.e
           AND EXISTS (SELECT 1 FROM queen.log_txids t
                        WHERE t.partition_id = b.pid AND t.transaction_id = b.tx);
        IF FOUND THEN
            RETURN NEXT b.i;
        END IF;
    END LOOP;
END
$$;
