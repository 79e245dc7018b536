-- Partition walks that cost their window, not the queue (issue 16).
-- Names are identifiers compared bytewise, as the in-memory model orders them: the ring's reseed
-- pages by keyset on (queue_id, name), which needs the index's order to be the comparison's.
-- Rebuilds the (queue_id, name) index under an ACCESS EXCLUSIVE lock.
ALTER TABLE queen.log_partitions ALTER COLUMN name TYPE text COLLATE "C";
-- The wildcard scan starts at a random partition id and reads forward in this index.
CREATE INDEX IF NOT EXISTS log_partitions_queue_id ON queen.log_partitions (queue_id, id);
DROP FUNCTION IF EXISTS queen.log_pending_partitions_v1(text, text, integer);
