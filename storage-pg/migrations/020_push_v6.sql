-- push_v6 answers a push stored whole with one row (the first offset and the count) instead of
-- one per item; push_v5 goes.
DROP FUNCTION IF EXISTS queen.push_v5(text, text, text[], uuid[], bytea, timestamptz, boolean, boolean);
