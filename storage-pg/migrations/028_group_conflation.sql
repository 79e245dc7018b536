-- Conflation (last-value delivery) is a policy of (queue, consumer group), fixed when the group
-- registers (queen_core::claim::policy_step).
ALTER TABLE queen.consumer_groups_metadata
    ADD COLUMN IF NOT EXISTS conflation boolean NOT NULL DEFAULT false;

-- The pop procedures take the policy (log_pop_v2) or the pop's wish (the others) and answer the
-- stored policy; the v1 shapes are gone. Brokers older than this migration call them: stop them
-- before starting a newer one on the same database.
DROP FUNCTION IF EXISTS queen.log_pop_specific_v1(
    text, text, text, uuid, integer, boolean, integer, text, timestamptz, boolean);
DROP FUNCTION IF EXISTS queen.log_pop_wildcard_v1(
    text, text, uuid, integer, integer, boolean, integer, text, timestamptz, boolean);
DROP FUNCTION IF EXISTS queen.log_pop_loop_v1(
    queen.queues, text, text[], uuid[], uuid, integer, integer, boolean, integer, boolean, text,
    timestamptz, boolean, timestamptz);
DROP FUNCTION IF EXISTS queen.log_pop_v1(
    uuid, text, text, uuid, integer, boolean, integer, integer, integer, boolean, text,
    timestamptz, boolean, timestamptz, integer);
