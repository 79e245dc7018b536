-- The ring's list pop calls log_pop_loop_v1 directly (the queue row as a sub-select): the
-- log_pop_list_v1 wrapper copied every answer row, blobs included, through one more plpgsql
-- tuplestore, about a quarter of a pop's time. The wrapper goes.
DROP FUNCTION IF EXISTS queen.log_pop_list_v1(text, text, text[], uuid, integer, integer, boolean, integer, boolean, text, timestamptz, boolean);
