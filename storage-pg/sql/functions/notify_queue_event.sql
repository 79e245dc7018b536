-- A queue was created, configured or deleted: `queue\n<queue>` on queen_event (see
-- notify_cursor_event for the channel's payloads).
CREATE OR REPLACE FUNCTION queen.notify_queue_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('queen_event',
        'queue' || E'\n' || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END
$$;
