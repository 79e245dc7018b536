-- A group's subscription record changed or was deleted: `group\n<queue>\n<group>` on
-- queen_event (see notify_cursor_event for the channel's payloads).
CREATE OR REPLACE FUNCTION queen.notify_subscription_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('queen_event', 'group' || E'\n' || OLD.queue_name || E'\n' || OLD.consumer_group);
    RETURN NULL;
END
$$;
