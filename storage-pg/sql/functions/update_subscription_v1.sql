-- Sets the subscription timestamp of every record of a group.
CREATE OR REPLACE FUNCTION queen.update_subscription_v1(p_group text, p_ts timestamptz)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH u AS (
        UPDATE queen.consumer_groups_metadata m SET subscription_timestamp = p_ts
         WHERE m.consumer_group = p_group
        RETURNING 1)
    SELECT count(*)::integer FROM u
$$;
