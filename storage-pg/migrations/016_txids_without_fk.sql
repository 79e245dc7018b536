-- The transactionId rows lose their foreign key to the partition: its per-row check (a trigger
-- and a locking SELECT of the partition for every message) doubled the cost of writing them,
-- measured in the push profile (docs/benchmarks.md). push_v5 writes them under the partition's
-- lock, retention deletes them with their segments, and the two functions that remove
-- partitions (delete_queue_v1, remove_inactive_partitions_v1) delete them explicitly.
ALTER TABLE queen.log_txids DROP CONSTRAINT IF EXISTS log_txids_partition_id_fkey;
-- push_v5 adds p_expect_new (a plain insert of the rows when no duplicate is expected).
DROP FUNCTION IF EXISTS queen.push_v4(text, text, text[], uuid[], bytea, timestamptz, boolean);
