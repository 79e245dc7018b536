-- Timers: a message held until deliver_at, then pushed to its queue in the transaction that
-- deletes the row (one firing, whichever broker gets the row lock first). message_id names the
-- incarnation: a reschedule mints a new one, so a firing read before it removes nothing.
CREATE TABLE queen.timers (
    queue      text COLLATE "C" NOT NULL,
    timer_key  text COLLATE "C" NOT NULL,
    partition  text NOT NULL,
    payload    bytea NOT NULL,
    txn        text NOT NULL,
    message_id uuid NOT NULL,
    deliver_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (queue, timer_key)
);

-- The firing's walk, earliest first.
CREATE INDEX timers_due ON queen.timers (deliver_at);
