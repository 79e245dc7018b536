-- partitions/changed pages a queue's partitions by name compared bytewise ("C"), the order the
-- model keeps and every client sees; the (queue_id, name) unique index sorts by the database's
-- collation, which may differ.
CREATE INDEX IF NOT EXISTS log_partitions_name_c ON queen.log_partitions (queue_id, (name COLLATE "C"));
