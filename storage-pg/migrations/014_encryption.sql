-- Payload encryption at rest (issue 17). push_v4 takes whether the payloads are sealed, so a
-- queue with encryptionEnabled refuses plaintext in the push's own transaction: a new signature,
-- so a new name, and push_v3 goes. Brokers older than this migration call push_v3: stop them
-- first.
DROP FUNCTION IF EXISTS queen.push_v3(text, text, text[], uuid[], bytea, timestamptz);
-- Cluster-wide settings brokers agree on. 'encryption_key_check': a constant sealed with the
-- QUEEN_ENCRYPTION_KEY of the first broker that had one; a broker whose key cannot open it
-- refuses to start, so no broker writes with or reads under a different key.
CREATE TABLE IF NOT EXISTS queen.cluster_settings (
    name  text PRIMARY KEY,
    value bytea NOT NULL,
    set_at timestamptz NOT NULL DEFAULT now()
);
