-- ack_v2 takes partitions already told apart by the broker (an id or a number) and acks a call of
-- only completed items in one statement; ack_v1 (text partition references) goes.
DROP FUNCTION IF EXISTS queen.ack_v1(text, text[], text[], text[], text[], text[]);
