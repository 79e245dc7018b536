-- Ephemeral queues' declared configuration. The contents live in a broker's memory and survive
-- nothing; the declaration survives everything, so a restarted deployment comes back with the
-- queue configured and empty.
CREATE TABLE queen.ephemeral_queues (
    name       text COLLATE "C" PRIMARY KEY,
    options    jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Which broker holds each ephemeral queue's ring when several share this database. A broker is
-- alive while its row's alive_until is ahead (it renews every second); a queue whose owner is
-- not alive is claimed by the next broker that needs it. Logged tables: after a crash of this
-- database an owner must still find its claims, or a second broker could claim a queue the first
-- still serves.
CREATE TABLE queen.ephemeral_brokers (
    incarnation bigint PRIMARY KEY,
    address     text NOT NULL,
    alive_until timestamptz NOT NULL
);

-- epoch counts a queue's changes of hands: an owner whose liveness lapsed and who finds the same
-- epoch when it renews knows nobody held the queue meanwhile, and keeps its ring.
CREATE TABLE queen.ephemeral_owners (
    queue       text COLLATE "C" PRIMARY KEY,
    incarnation bigint NOT NULL,
    epoch       bigint NOT NULL DEFAULT 1
);
