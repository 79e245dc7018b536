-- A stream's state rows belong to a source partition: when the partition goes (its queue
-- deleted, or retention removing it as inactive), its state goes with it instead of staying
-- behind, unreachable, forever. A cycle holds the partition row (FOR KEY SHARE) from its fence
-- to its commit, so a deletion waits for cycles in flight and then removes what they wrote.
DELETE FROM queen_streams.state s
 WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions p WHERE p.id = s.partition_id);
ALTER TABLE queen_streams.state
    ADD CONSTRAINT state_partition_fk FOREIGN KEY (partition_id)
        REFERENCES queen.log_partitions (id) ON DELETE CASCADE;
CREATE INDEX state_by_partition ON queen_streams.state (partition_id);
