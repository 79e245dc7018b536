-- Dead letters newest first, each with the segment row holding its message (NULL once retention
-- removed it).
CREATE OR REPLACE FUNCTION queen.dead_letters_v1(
    p_queue text, p_group text, p_partition text, p_from timestamptz, p_to timestamptz,
    p_limit integer, p_offset integer
) RETURNS TABLE (
    o_id bigint, o_partition text, o_partition_id uuid, o_group text, o_offset bigint, o_txid text,
    o_error text, o_retry_count integer, o_failed_at timestamptz,
    o_base bigint, o_end bigint, o_created timestamptz, o_blob bytea, o_total bigint
)
LANGUAGE sql STABLE AS $$
    WITH matching AS (
        SELECT d.*
          FROM queen.dead_letters d JOIN queen.queues q ON q.id = d.queue_id
         WHERE q.name = p_queue
           AND (p_group IS NULL OR d.consumer_group = p_group)
           AND (p_partition IS NULL OR d.partition_name = p_partition)
           AND (p_from IS NULL OR d.failed_at >= p_from)
           AND (p_to IS NULL OR d.failed_at <= p_to)
    ), total AS (SELECT count(*) AS n FROM matching)
    SELECT m.id, m.partition_name, m.partition_id, m.consumer_group, m.msg_offset, m.transaction_id,
           m.error, m.retry_count, m.failed_at, s.base_offset, s.end_offset, s.created_at, s.blob, total.n
      FROM matching m
     CROSS JOIN total
      LEFT JOIN LATERAL (
            SELECT s.base_offset, s.end_offset, s.created_at, s.blob
              FROM queen.log_segments s
             WHERE s.partition_id = m.partition_id AND s.base_offset <= m.msg_offset
             ORDER BY s.base_offset DESC LIMIT 1) s ON s.end_offset >= m.msg_offset
     ORDER BY m.id DESC
     LIMIT p_limit OFFSET p_offset
$$;
