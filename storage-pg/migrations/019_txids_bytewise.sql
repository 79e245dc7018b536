-- transactionIds are identifiers: equal when their bytes are. Under the database's collation
-- (C.UTF-8, en_US.UTF-8, ...) every comparison in log_txids_pkey went through strcoll; with
-- COLLATE "C" it is memcmp. Nothing orders by transactionId, so no answer changes. Rebuilds the
-- primary key index (an ACCESS EXCLUSIVE lock for as long as that takes on a large table).
ALTER TABLE queen.log_txids ALTER COLUMN transaction_id TYPE text COLLATE "C";
