-- The admin API's reads (issue 18): partition creation times, the newest-first segment listing,
-- message traces and per-minute broker samples.

-- Existing partitions get the migration's time (now() is evaluated once: no table rewrite).
ALTER TABLE queen.log_partitions ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now();

-- The message browser reads segments newest first across partitions; one entry per segment,
-- not per message.
CREATE INDEX IF NOT EXISTS log_segments_created ON queen.log_segments (created_at, partition_id, base_offset);

-- Traces of a stored message (POST /api/v1/traces). msg_offset ties a trace to its message, so
-- retention removes it with the segment; a partition's removal takes its traces.
CREATE TABLE IF NOT EXISTS queen.message_traces (
    id             bigserial PRIMARY KEY,
    partition_id   uuid NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    transaction_id text NOT NULL,
    msg_offset     bigint NOT NULL,
    consumer_group text NOT NULL,
    event_type     text NOT NULL,
    data           jsonb NOT NULL,
    worker_id      text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS message_traces_message ON queen.message_traces (partition_id, transaction_id, id);
CREATE INDEX IF NOT EXISTS message_traces_offset ON queen.message_traces (partition_id, msg_offset);

CREATE TABLE IF NOT EXISTS queen.message_trace_names (
    trace_id   bigint NOT NULL REFERENCES queen.message_traces (id) ON DELETE CASCADE,
    name       text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (name, trace_id)
);
CREATE INDEX IF NOT EXISTS message_trace_names_trace ON queen.message_trace_names (trace_id);

-- One row per broker per minute: the status and analytics time series.
CREATE TABLE IF NOT EXISTS queen.worker_samples (
    hostname       text NOT NULL,
    worker_id      text NOT NULL,
    bucket         timestamptz NOT NULL,
    push_requests  bigint NOT NULL DEFAULT 0,
    push_messages  bigint NOT NULL DEFAULT 0,
    pop_requests   bigint NOT NULL DEFAULT 0,
    pop_messages   bigint NOT NULL DEFAULT 0,
    pop_empty      bigint NOT NULL DEFAULT 0,
    ack_requests   bigint NOT NULL DEFAULT 0,
    ack_messages   bigint NOT NULL DEFAULT 0,
    ack_failed     bigint NOT NULL DEFAULT 0,
    dead_lettered  bigint NOT NULL DEFAULT 0,
    db_errors      bigint NOT NULL DEFAULT 0,
    lag_avg_ms     double precision NOT NULL DEFAULT 0,
    lag_max_ms     double precision NOT NULL DEFAULT 0,
    cpu_user_pct   double precision NOT NULL DEFAULT 0,
    cpu_system_pct double precision NOT NULL DEFAULT 0,
    rss_bytes      bigint NOT NULL DEFAULT 0,
    pool_size      bigint NOT NULL DEFAULT 0,
    pool_in_use    bigint NOT NULL DEFAULT 0,
    parked         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, hostname, worker_id)
);
