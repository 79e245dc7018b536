-- The partition row keeps the created_at of its newest segment (newest_at) and the head it was
-- written at (newest_offset), so a push finds the floor of its own created_at on the row it
-- already locks instead of reading the partition's newest segment. That read was an index probe
-- on a table planned at its real size, and a sequential scan with a sort of every segment on a
-- session that planned it while log_segments was small: 35% of PostgreSQL's CPU in the batch-1
-- push profile (docs/benchmarks.md). A row whose newest_offset is not its head (a partition
-- written before this migration, or by a broker of the previous version during a rolling
-- upgrade, whose push does not keep the columns) falls back to reading the segment.
--
-- Adding a nullable column rewrites nothing, but takes the table's exclusive lock, and while it
-- waits for one (behind a long admin-totals pass, say) every push and pop queues behind it. So
-- each try waits at most 200 ms and lets them through between tries: the brokers still serving
-- during a rolling upgrade stall that long at most, however long the migration waits.
DO $$
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE queen.log_partitions
                ADD COLUMN IF NOT EXISTS newest_at timestamptz,
                ADD COLUMN IF NOT EXISTS newest_offset bigint;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.05);
        END;
    END LOOP;
END
$$;
