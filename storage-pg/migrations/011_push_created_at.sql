-- push_v3 takes the time a push was accepted (a push drained from a broker's file buffer keeps
-- the time it was answered `buffered`, not the time of the drain): a new signature, so a new
-- name, and push_v2 goes. Brokers older than this migration call push_v2: stop them first.
DROP FUNCTION IF EXISTS queen.push_v2(text, text, text[], uuid[], bytea);
