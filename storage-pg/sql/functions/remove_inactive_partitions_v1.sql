-- Deletes up to p_limit partitions that hold no segment, had no push for p_inactive_secs and no
-- live lease, with their cursor rows (the foreign keys cascade) and any transactionId rows (which
-- have none: the candidates are locked from the statement's start, so no push adds one after it). A later push with the same name
-- creates a fresh partition; its cursors are seeded by the subscription rules, as for any new
-- partition. Rows another transaction holds are skipped.
CREATE OR REPLACE FUNCTION queen.remove_inactive_partitions_v1(p_inactive_secs bigint, p_limit integer)
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH candidates AS (
        SELECT lp.id
          FROM queen.log_partitions lp
         WHERE lp.oldest_at IS NULL
           AND lp.last_write_at < queen.now() - make_interval(secs => p_inactive_secs)
           AND NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                            WHERE c.partition_id = lp.id AND c.lease_expires_at > queen.now())
         ORDER BY lp.last_write_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM queen.log_partitions lp USING candidates c
         WHERE lp.id = c.id AND lp.oldest_at IS NULL
        RETURNING lp.id),
    txids AS (
        DELETE FROM queen.log_txids t USING gone g WHERE t.partition_id = g.id)
    SELECT count(*) FROM gone
$$;
