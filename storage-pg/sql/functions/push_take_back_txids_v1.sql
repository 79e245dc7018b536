-- A push that answers without appending (a duplicate met, or maxSize) removes the transactionId
-- rows it inserted under its partition lock: those past the partition's head (p_last). Earlier
-- messages' rows with the same ids sit at or below the head and stay. One index probe per id.
CREATE OR REPLACE FUNCTION queen.push_take_back_txids_v1(p_partition uuid, p_last bigint, p_txids text[])
RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM queen.log_txids t
     USING unnest(p_txids) AS u (tx)
     WHERE t.partition_id = p_partition AND t.transaction_id = u.tx AND t.msg_offset > p_last
$$;
