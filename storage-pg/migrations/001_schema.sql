-- Schema `queen`: queues, the partition log (segments of zstd-compressed frames), cursors,
-- subscriptions, watermarks, dead letters and transactionId de-duplication.

CREATE TABLE IF NOT EXISTS queen.queues (
    id                          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                        text NOT NULL UNIQUE,
    namespace                   text NOT NULL DEFAULT '',
    task                        text NOT NULL DEFAULT '',
    lease_time                  integer NOT NULL DEFAULT 300,
    retry_limit                 integer NOT NULL DEFAULT 3,
    retry_delay                 integer NOT NULL DEFAULT 1000,
    priority                    integer NOT NULL DEFAULT 0,
    delayed_processing          integer NOT NULL DEFAULT 0,
    window_buffer               integer NOT NULL DEFAULT 0,
    max_size                    integer NOT NULL DEFAULT 0,
    ttl                         integer NOT NULL DEFAULT 3600,
    retention_enabled           boolean NOT NULL DEFAULT false,
    retention_seconds           integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    encryption_enabled          boolean NOT NULL DEFAULT false,
    dead_letter_queue           boolean NOT NULL DEFAULT false,
    dlq_after_max_retries       boolean NOT NULL DEFAULT false,
    max_wait_time_seconds       integer NOT NULL DEFAULT 0,
    -- Milliseconds an under-full claim may be held in the broker (0 = off).
    min_pop_wait_time           integer NOT NULL DEFAULT 0,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    CHECK (length(name) <= 255)
);
CREATE INDEX IF NOT EXISTS queues_namespace_task ON queen.queues (namespace, task);

CREATE TABLE IF NOT EXISTS queen.log_partitions (
    id            uuid PRIMARY KEY,
    queue_id      uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name          text NOT NULL,
    -- Offsets are allocated under this row's lock, so commit order equals offset order.
    last_offset   bigint NOT NULL DEFAULT -1,
    -- Quantized to one second: a push touches it without churning the index on every message.
    last_write_at timestamptz NOT NULL,
    UNIQUE (queue_id, name),
    CHECK (length(name) <= 255)
);
-- The wildcard scan's write-watermark filter.
CREATE INDEX IF NOT EXISTS log_partitions_write ON queen.log_partitions (queue_id, last_write_at);

CREATE TABLE IF NOT EXISTS queen.log_segments (
    partition_id uuid NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    base_offset  bigint NOT NULL,
    end_offset   bigint NOT NULL,
    msg_count    integer NOT NULL,
    -- Monotone in base_offset: the window probe and the delay filter rely on it.
    created_at   timestamptz NOT NULL,
    -- Frames compressed by the broker; PostgreSQL never looks inside.
    blob         bytea NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
);
-- Already zstd-compressed: do not let TOAST try again.
ALTER TABLE queen.log_segments ALTER COLUMN blob SET STORAGE EXTERNAL;

CREATE TABLE IF NOT EXISTS queen.log_txids (
    partition_id   uuid NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    transaction_id text NOT NULL,
    msg_offset     bigint NOT NULL,
    message_id     uuid NOT NULL,
    PRIMARY KEY (partition_id, transaction_id)
);

-- The cursor row of one (partition, consumer group).
CREATE TABLE IF NOT EXISTS queen.log_consumers (
    partition_id      uuid NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    consumer_group    text NOT NULL,
    committed         bigint NOT NULL,
    worker_id         uuid,
    lease_expires_at  timestamptz,
    lease_acquired_at timestamptz,
    batch_end         bigint,
    -- Telemetry: deliveries of the batch starting at attempt_offset. Never spends the budget.
    attempt_count     integer NOT NULL DEFAULT 0,
    attempt_offset    bigint,
    total_consumed    bigint NOT NULL DEFAULT 0,
    -- The per-message retry budget: failed acks charged to the message at retry_offset.
    retry_offset      bigint,
    retry_count       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_id, consumer_group)
);
CREATE INDEX IF NOT EXISTS log_consumers_worker ON queen.log_consumers (worker_id) WHERE worker_id IS NOT NULL;

-- The durable subscription record of a group on a queue (keyed by name: it outlives a queue
-- deletion, as in Queen 0.15), and the group-first-contact marker.
CREATE TABLE IF NOT EXISTS queen.consumer_groups_metadata (
    queue_name             text NOT NULL,
    consumer_group         text NOT NULL,
    subscription_timestamp timestamptz,
    created_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, consumer_group)
);

-- The wildcard scan's empty-scan write watermark per (queue, group).
CREATE TABLE IF NOT EXISTS queen.log_watermarks (
    queue_id       uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group text NOT NULL,
    watermark      timestamptz NOT NULL,
    last_checked   timestamptz NOT NULL,
    PRIMARY KEY (queue_id, consumer_group)
);

CREATE TABLE IF NOT EXISTS queen.dead_letters (
    id             bigserial PRIMARY KEY,
    queue_id       uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    partition_id   uuid NOT NULL,
    partition_name text NOT NULL,
    consumer_group text NOT NULL,
    msg_offset     bigint NOT NULL,
    transaction_id text NOT NULL,
    error          text,
    retry_count    integer NOT NULL,
    failed_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letters_queue ON queen.dead_letters (queue_id, failed_at DESC);

-- queen.now(): PostgreSQL's transaction time plus an offset that is always 0 in production.
-- The conformance suite moves it to test leases and delays without sleeping.
CREATE TABLE IF NOT EXISTS queen.clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    offset_us bigint NOT NULL DEFAULT 0
);
INSERT INTO queen.clock DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION queen.now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() + (SELECT c.offset_us FROM queen.clock c) * interval '1 microsecond'
$$;
