-- Since when each broker sharing ephemeral queues has been alive without a break. A broker
-- takes over the queues of an owner whose liveness ran out only once it has itself been alive
-- for a while (queen_core::ephemeral::ownership::TAKEOVER_AFTER_MS): after a database outage
-- longer than a broker's liveness every row has run out, and the first broker called once the
-- database is back used to take every queue it was called for from owners that had not renewed
-- yet, dropping their contents. A row written before this migration counts from now, so brokers
-- of the previous version wait that long once before taking anything over.
ALTER TABLE queen.ephemeral_brokers
    ADD COLUMN IF NOT EXISTS alive_since timestamptz NOT NULL DEFAULT now();
