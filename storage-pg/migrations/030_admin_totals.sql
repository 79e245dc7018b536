-- The admin totals' last pass over every partition (one row), serialized by the broker that ran
-- it: a restarted broker, or another broker of the deployment, answers the admin plane from it
-- at once instead of making its first request wait for a pass of its own (tens of seconds at
-- millions of partitions), and brokers take turns passing instead of each passing.
CREATE TABLE queen.admin_totals (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    taken_at  timestamptz NOT NULL,
    body      bytea NOT NULL
);
