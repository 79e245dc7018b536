-- From here on, migrations hold tables, indexes, triggers and data changes only. Every function
-- has one current definition in storage-pg/sql/functions/<name>.sql, (re)applied at start-up
-- after the migrations (see migrate.rs); the definitions in migrations 001-009 are history.

-- push_v1 answered a maxSize refusal as the string 'full:<cap>:<backlog>'; push_v2 reports it in
-- typed columns (o_max_size, o_backlog). Brokers older than this migration call push_v1: stop
-- them before starting a newer one on the same database.
DROP FUNCTION IF EXISTS queen.push_v1(text, text, text[], uuid[], bytea);

-- Which function definitions are applied, by content: a start-up re-applies only what changed.
CREATE TABLE IF NOT EXISTS queen.schema_functions (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
