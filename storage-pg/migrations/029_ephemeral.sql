-- Ephemeral queues' declared configuration. The contents live in a broker's memory and survive
-- nothing; the declaration survives everything, so a restarted deployment comes back with the
-- queue configured and empty.
CREATE TABLE queen.ephemeral_queues (
    name       text COLLATE "C" PRIMARY KEY,
    options    jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
