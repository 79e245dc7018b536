-- Stream queries and their per-(query, source partition) state. The schema and table names are
-- Queen 0.15's (`queen_streams.queries`, `queen_streams.state`), which users' clean-up scripts
-- name (client 0.15's test suite deletes test queries by SQL); deleting a query deletes its
-- state. Keys compare bytewise ("C"), the order the model keeps.
CREATE SCHEMA IF NOT EXISTS queen_streams;

CREATE TABLE queen_streams.queries (
    id           uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    source_queue text NOT NULL,
    sink_queue   text,
    config_hash  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queen_streams.state (
    query_id     uuid NOT NULL REFERENCES queen_streams.queries (id) ON DELETE CASCADE,
    partition_id uuid NOT NULL,
    key          text COLLATE "C" NOT NULL,
    value        jsonb NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (query_id, partition_id, key)
);
