-- Retention and eviction (issue 14): the columns and indexes that let the retention worker find
-- what to remove without a scan of every partition, the cluster-wide maintenance lease, and the
-- autovacuum settings that keep tables flat under constant deletes.

-- The created_at of a partition's oldest segment (NULL: it holds none). Set by the push that
-- finds it NULL, recomputed by retention under the partition row's lock.
ALTER TABLE queen.log_partitions ADD COLUMN IF NOT EXISTS oldest_at timestamptz;
UPDATE queen.log_partitions p
   SET oldest_at = (SELECT s.created_at FROM queen.log_segments s
                     WHERE s.partition_id = p.id ORDER BY s.base_offset LIMIT 1)
 WHERE p.oldest_at IS NULL;
-- A queue's retention candidates in (oldest segment, id) order: the batch's keyset.
CREATE INDEX IF NOT EXISTS log_partitions_oldest
    ON queen.log_partitions (queue_id, oldest_at, id) WHERE oldest_at IS NOT NULL;
-- Empty partitions by last push: the inactive-partition cleanup's candidates.
CREATE INDEX IF NOT EXISTS log_partitions_empty
    ON queen.log_partitions (last_write_at) WHERE oldest_at IS NULL;

-- A dead letter pins its message's segment against completed retention; expired segments take
-- their dead letters with them. Both look dead letters up by message.
CREATE INDEX IF NOT EXISTS dead_letters_message ON queen.dead_letters (partition_id, msg_offset);
CREATE INDEX IF NOT EXISTS dead_letters_failed ON queen.dead_letters (failed_at);

-- Whether a subscribed group still reads a queue (a cursor row on it): retention asks per group.
CREATE INDEX IF NOT EXISTS log_consumers_group ON queen.log_consumers (consumer_group);

-- One broker at a time runs retention: it holds this lease (renewed while it works; a broker
-- that dies loses it when it runs out).
CREATE TABLE IF NOT EXISTS queen.maintenance_leases (
    name   text PRIMARY KEY,
    holder text NOT NULL,
    until  timestamptz NOT NULL
);

-- Deletes leave dead tuples; the default trigger (20% of the table) lets a table of a million
-- rows carry 200k dead ones before a vacuum. Fixed thresholds vacuum these tables as often as
-- their churn needs. vacuum_truncate off: truncating a table's empty tail takes an ACCESS
-- EXCLUSIVE lock, which would stall every push and pop behind it.
ALTER TABLE queen.log_segments SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02, vacuum_truncate = false);
ALTER TABLE queen.log_txids SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 50000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 200000,
    autovacuum_analyze_scale_factor = 0.02, vacuum_truncate = false);
-- Updated by every claim and ack, and by every push: small and hot.
ALTER TABLE queen.log_consumers SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0, fillfactor = 80);
ALTER TABLE queen.log_partitions SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0, fillfactor = 80);
ALTER TABLE queen.dead_letters SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false);
