-- The key/value store (and the lock permits kept in it, namespace 'queen-locks').
-- Versions come from one sequence, so a key's version rises with every write of it, across
-- deletes and expiries: a compare-and-set never matches a recycled version, and a lock's
-- fencing token (its permit row's version) only rises. Keys compare bytewise ("C"), the
-- order getPrefix pages in and the model keeps.
CREATE SEQUENCE queen.kv_versions;

CREATE TABLE queen.kv (
    ns         text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      jsonb NOT NULL,
    version    bigint NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (ns, key)
);

-- The sweeper's walk: rows past their expiry, oldest first.
CREATE INDEX kv_expiring ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;
