-- The cursors' secondary index leads with the group and ends with the partition, so it is a
-- unique step for a lookup by (partition, group) too. On (consumer_group) alone it tied with the
-- primary key while log_consumers was a page or two, and a pop's cursor probe cached the plan
-- that walks every cursor of the group: a fresh group's pops on 100k partitions ran at a quarter
-- of their rate while its cursors were made (2.1 ms a pop against 0.3). Retention's per-group
-- question ("does the group hold a cursor on this queue") reads its leading column as before.
-- Builds the index under a SHARE lock (writes to log_consumers wait for it).
CREATE INDEX IF NOT EXISTS log_consumers_group_partition
    ON queen.log_consumers (consumer_group, partition_id);
DROP INDEX IF EXISTS queen.log_consumers_group;
