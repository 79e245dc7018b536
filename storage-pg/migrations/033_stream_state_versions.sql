-- Stream state rows carry a version (a new one at every write, from a sequence, so a row deleted
-- and written again never repeats one) and the version their last ripe read saw. A flush (a
-- cycle without an ack) may delete a window's row only as its ripe read saw it: a regular cycle
-- that added an event to the window after that read gave the row a new version, and the flush
-- would otherwise emit the window without the event and delete it
-- (queen_core::streams::check_cycle). Rows written before this migration have version 0 and no
-- stamp: the next ripe read stamps them.
CREATE SEQUENCE IF NOT EXISTS queen_streams.state_versions;
ALTER TABLE queen_streams.state
    ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS ripe_read_version bigint;
