//! Stream queries and state on PostgreSQL (`queen_streams`, migration 026). Registration reads
//! the name's row under its lock and does what core's `registration_step` names; a cycle's
//! state part runs inside the cycle's transaction (`TxOp::Stream`, from `delivery.rs`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use queen_core::storage::{StorageError, StorageResult, StreamStorage};
use queen_core::streams::{
    self, LeaseView, QueryRegistration, Registration, RegistrationStep, StateQuery, StateRow,
    StoredQuery, StreamCycleOp, StreamRefusal,
};

use crate::error::{pg_err, pool_err, prepared, retry_contention};
use crate::{from_system_time, PgStorage};

/// A partition id as PostgreSQL stores it (`None`: not a uuid, so no partition has it).
fn partition_uuid(id: &str) -> Option<uuid::Uuid> {
    uuid::Uuid::parse_str(id).ok()
}

fn json_text(value: &serde_json::Value) -> StorageResult<String> {
    serde_json::to_string(value).map_err(|e| StorageError::Internal(format!("state value: {e}")))
}

impl PgStorage {
    async fn register_once(
        &self,
        req: &QueryRegistration,
        minted_id: uuid::Uuid,
    ) -> StorageResult<Registration> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client
            .transaction()
            .await
            .map_err(pg_err("streams register: begin"))?;
        // Insert-if-absent first, so two first registrations of one name meet on its unique
        // index (the loser waits, then finds the winner's row) instead of both inserting.
        let inserted = tx
            .execute(
                &prepared(
                    &tx,
                    "INSERT INTO queen_streams.queries (id, name, source_queue, sink_queue, config_hash)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
                )
                .await?,
                &[
                    &minted_id,
                    &req.name,
                    &req.source_queue,
                    &req.sink_queue,
                    &req.config_hash,
                ],
            )
            .await
            .map_err(pg_err("streams register: insert"))?;
        if inserted == 1 {
            debug_assert_eq!(
                streams::registration_step(req, None),
                RegistrationStep::Create
            );
            tx.commit()
                .await
                .map_err(pg_err("streams register: commit"))?;
            return Ok(Registration::Registered {
                query_id: minted_id,
                fresh: true,
                reset: false,
            });
        }
        let row = tx
            .query_one(
                &prepared(
                    &tx,
                    "SELECT id, config_hash FROM queen_streams.queries WHERE name = $1 FOR UPDATE",
                )
                .await?,
                &[&req.name],
            )
            .await
            .map_err(pg_err("streams register: read"))?;
        let stored = StoredQuery {
            id: row.get(0),
            config_hash: row.get(1),
        };
        let answer = match streams::registration_step(req, Some(&stored)) {
            RegistrationStep::Create => {
                return Err(StorageError::Internal(
                    "streams register: a name refused on insert has no row".into(),
                ))
            }
            RegistrationStep::Existing => Registration::Registered {
                query_id: stored.id,
                fresh: false,
                reset: false,
            },
            RegistrationStep::Mismatch => Registration::HashMismatch {
                stored_hash: stored.config_hash,
            },
            RegistrationStep::Reset => {
                tx.execute(
                    &prepared(&tx, "DELETE FROM queen_streams.state WHERE query_id = $1").await?,
                    &[&stored.id],
                )
                .await
                .map_err(pg_err("streams register: drop state"))?;
                tx.execute(
                    &prepared(
                        &tx,
                        "UPDATE queen_streams.queries
                            SET config_hash = $2, source_queue = $3, sink_queue = $4, updated_at = now()
                          WHERE id = $1",
                    )
                    .await?,
                    &[
                        &stored.id,
                        &req.config_hash,
                        &req.source_queue,
                        &req.sink_queue,
                    ],
                )
                .await
                .map_err(pg_err("streams register: new hash"))?;
                Registration::Registered {
                    query_id: stored.id,
                    fresh: false,
                    reset: true,
                }
            }
        };
        tx.commit()
            .await
            .map_err(pg_err("streams register: commit"))?;
        Ok(answer)
    }
}

#[async_trait]
impl StreamStorage for PgStorage {
    async fn register_stream_query(
        &self,
        req: &QueryRegistration,
        minted_id: uuid::Uuid,
    ) -> StorageResult<Registration> {
        retry_contention(move || self.register_once(req, minted_id)).await
    }

    async fn stream_state(&self, query: &StateQuery) -> StorageResult<Option<Vec<StateRow>>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let Some(partition) = partition_uuid(&query.partition_id) else {
            // No partition has this id, so the shard is empty; the query may still be unknown.
            let known = client
                .query_opt(
                    &prepared(&client, "SELECT 1 FROM queen_streams.queries WHERE id = $1").await?,
                    &[&query.query_id],
                )
                .await
                .map_err(pg_err("streams state: query"))?;
            return Ok(known.map(|_| vec![]));
        };
        // One statement, one snapshot: no row at all means no such query; a row without a key
        // is the query with an empty selection. The filters are `StateQuery::selects`. A ripe
        // read (`streams::ripe_read_stamps`) stamps each row it answers with the row's version,
        // under the row's lock, in the same statement.
        let statement = if streams::ripe_read_stamps(query) {
            "WITH q AS (SELECT id FROM queen_streams.queries WHERE id = $1),
                  stamped AS (
                    UPDATE queen_streams.state s SET ripe_read_version = s.version
                      FROM q
                     WHERE s.query_id = q.id AND s.partition_id = $2
                       AND (cardinality($3::text[]) = 0 OR s.key = ANY($3::text[]))
                       AND ($4::text IS NULL OR starts_with(s.key, $4::text))
                       AND CASE WHEN jsonb_typeof(s.value -> 'windowEnd') = 'number'
                                THEN round((s.value ->> 'windowEnd')::numeric) <= $5::bigint
                                ELSE false END
                 RETURNING s.key, s.value, s.updated_at)
             SELECT st.key, st.value::text, st.updated_at
               FROM q LEFT JOIN stamped st ON true
              ORDER BY st.key"
        } else {
            "SELECT s.key, s.value::text, s.updated_at
               FROM queen_streams.queries q
               LEFT JOIN queen_streams.state s
                 ON s.query_id = q.id AND s.partition_id = $2
                AND (cardinality($3::text[]) = 0 OR s.key = ANY($3::text[]))
                AND ($4::text IS NULL OR starts_with(s.key, $4::text))
                AND ($5::bigint IS NULL
                     OR (jsonb_typeof(s.value -> 'windowEnd') = 'number'
                         AND round((s.value ->> 'windowEnd')::numeric) <= $5::bigint))
              WHERE q.id = $1
              ORDER BY s.key"
        };
        let rows = client
            .query(
                &prepared(&client, statement).await?,
                &[
                    &query.query_id,
                    &partition,
                    &query.keys,
                    &query.key_prefix,
                    &query.ripe_at_or_before,
                ],
            )
            .await
            .map_err(pg_err("streams state: read"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(key) = row.get::<_, Option<String>>(0) else {
                continue;
            };
            let text: String = row.get(1);
            let value = serde_json::from_str(&text)
                .map_err(|e| StorageError::Internal(format!("streams state: value: {e}")))?;
            out.push(StateRow {
                key,
                value,
                updated_at: from_system_time(row.get(2)),
            });
        }
        Ok(Some(out))
    }
}

/// `TxOp::Stream`: the fence, then the state ops' net effect, inside the cycle's transaction.
/// Cycles of one (query, partition) shard are serialized by a transaction-scoped advisory lock
/// (the idle flush holds no lease, so the cursor row alone would not order it); the query row is
/// share-locked, so a reset or delete waits for cycles in flight; the partition row is
/// key-share-locked, so its deletion (which deletes its state) waits for the cycle; the cursor
/// row is locked for the fence, so no claim or ack slips between the fence and the cycle's own
/// ack (or, for a flush, no lease is taken before it commits); the rows the cycle deletes as read
/// are locked, so each is seen as it is now (one deleted since the statement began is absent).
/// All of that is one statement (a round trip each was most of a cycle's time), its parts
/// evaluated in the order written: shard lock, query row, partition, cursor row, state rows,
/// time. Locked reads answer the newest version of their rows after a wait (a plain read would
/// answer the statement's older snapshot). The verdict is core's `check_cycle`.
pub(crate) async fn cycle_op(
    tx: &impl GenericClient,
    op: &StreamCycleOp,
) -> StorageResult<Result<usize, StreamRefusal>> {
    let Some(partition) = partition_uuid(&op.partition_id) else {
        return Ok(Err(StreamRefusal::ForeignPartition));
    };
    let shard = format!("{}/{}", op.query_id, op.partition_id);
    let read_rows = streams::deletes_of_read_rows(&op.ops);
    let row = tx
        .query_one(
            &prepared(
                tx,
                "SELECT (SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 7173))) l),
                        (SELECT q.source_queue FROM queen_streams.queries q WHERE q.id = $2 FOR SHARE),
                        (SELECT qu.name FROM queen.log_partitions p
                           JOIN queen.queues qu ON qu.id = p.queue_id WHERE p.id = $3
                            FOR KEY SHARE OF p),
                        (SELECT c.worker_id FROM queen.log_consumers c
                          WHERE c.partition_id = $3 AND c.consumer_group = $4 FOR UPDATE),
                        (SELECT c.lease_expires_at FROM queen.log_consumers c
                          WHERE c.partition_id = $3 AND c.consumer_group = $4 FOR UPDATE),
                        (SELECT coalesce(array_agg(r.key || '/' || r.window::int || r.as_read::int),
                                         '{}') FROM
                           (SELECT s.key,
                                   coalesce(jsonb_typeof(s.value -> 'windowEnd') = 'number', false)
                                     AS window,
                                   s.ripe_read_version IS NOT DISTINCT FROM s.version AS as_read
                              FROM queen_streams.state s
                             WHERE cardinality($5::text[]) > 0 AND s.query_id = $2
                               AND s.partition_id = $3 AND s.key = ANY($5::text[])
                               FOR UPDATE) r),
                        queen.now()",
            )
            .await?,
            &[&shard, &op.query_id, &partition, &op.group, &read_rows],
        )
        .await
        .map_err(pg_err("streams cycle: fence"))?;
    let source: Option<String> = row.get(1);
    let partition_queue: Option<String> = row.get(2);
    // Each found row as `key/WR`: W its value has a numeric windowEnd, R its ripe-read stamp is
    // its version (1 or 0), after the key's last '/'.
    let found: Vec<String> = row.get(5);
    let rows_found = found
        .iter()
        .map(|f| {
            let (key, flags) = f.rsplit_once('/').unwrap_or((f.as_str(), "00"));
            streams::RowFound {
                key: key.to_string(),
                window: flags.starts_with('1'),
                as_ripe_read: flags.ends_with('1'),
            }
        })
        .collect::<Vec<_>>();
    let view = streams::CycleView {
        query_source: source.as_deref(),
        source_of_partition: partition_queue.as_deref(),
        lease: Some(LeaseView {
            worker: row.get(3),
            expires_at: row
                .get::<_, Option<std::time::SystemTime>>(4)
                .map(from_system_time),
        }),
        rows_found: &rows_found,
    };
    let now = from_system_time(row.get(6));
    if let Err(refusal) = streams::check_cycle(op, &view, now) {
        return Ok(Err(refusal));
    }
    let (upserts, deletes) = streams::net_effect(&op.ops);
    if !upserts.is_empty() {
        let mut object = serde_json::Map::with_capacity(upserts.len());
        for (k, v) in upserts {
            object.insert(k, v);
        }
        let text = json_text(&serde_json::Value::Object(object))?;
        tx.execute(
            &prepared(
                tx,
                "INSERT INTO queen_streams.state (query_id, partition_id, key, value, updated_at, version)
                 SELECT $1, $2, e.key, e.value, now(), nextval('queen_streams.state_versions')
                   FROM jsonb_each($3::text::jsonb) e
                 ON CONFLICT (query_id, partition_id, key)
                 DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at,
                               version = EXCLUDED.version",
            )
            .await?,
            &[&op.query_id, &partition, &text],
        )
        .await
        .map_err(pg_err("streams cycle: upsert"))?;
    }
    if !deletes.is_empty() {
        tx.execute(
            &prepared(
                tx,
                "DELETE FROM queen_streams.state
                  WHERE query_id = $1 AND partition_id = $2 AND key = ANY($3::text[])",
            )
            .await?,
            &[&op.query_id, &partition, &deletes],
        )
        .await
        .map_err(pg_err("streams cycle: delete"))?;
    }
    Ok(Ok(op.ops.len()))
}

/// `TxOp::EndLease`: ends the lease if that id still holds it live (the rule of
/// `queen_core::streams::lease_holds`, in the UPDATE's condition); the cursor trigger announces
/// the release. Answers the (queue, partition) whose lease ended.
pub(crate) async fn end_lease(
    tx: &impl GenericClient,
    group: &str,
    partition_id: &str,
    lease_id: &str,
) -> StorageResult<Option<(String, String)>> {
    let (Some(partition), Some(lease)) = (partition_uuid(partition_id), partition_uuid(lease_id))
    else {
        return Ok(None);
    };
    let row = tx
        .query_opt(
            &prepared(
                tx,
                "WITH ended AS (
                     UPDATE queen.log_consumers c
                        SET worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL,
                            batch_end = NULL
                      WHERE c.partition_id = $1 AND c.consumer_group = $2 AND c.worker_id = $3
                        AND c.lease_expires_at > queen.now()
                     RETURNING c.partition_id)
                 SELECT q.name, p.name FROM ended e
                   JOIN queen.log_partitions p ON p.id = e.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id",
            )
            .await?,
            &[&partition, &group, &lease],
        )
        .await
        .map_err(pg_err("streams: end lease"))?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}
