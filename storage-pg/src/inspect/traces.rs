//! Message traces: recording one, and reading them by message and by name.

use queen_core::storage::{StorageResult, TraceInput, TraceName, TraceRecord};

use super::{count, parse_uuid, ts};
use crate::error::{pg_err, pool_err};
use crate::PgStorage;

const TRACE_COLUMNS: &str = "tr.id, tr.partition_id, tr.transaction_id, q.name, p.name, tr.consumer_group,
       tr.event_type, tr.data::text, tr.worker_id,
       ARRAY(SELECT n.name FROM queen.message_trace_names n WHERE n.trace_id = tr.id ORDER BY n.name),
       tr.created_at";

fn trace_from_row(r: &tokio_postgres::Row) -> TraceRecord {
    TraceRecord {
        id: r.get(0),
        partition_id: r.get::<_, uuid::Uuid>(1).to_string(),
        transaction_id: r.get(2),
        queue: r.get(3),
        partition: r.get(4),
        group: r.get(5),
        event_type: r.get(6),
        data: r.get(7),
        worker_id: r.get(8),
        names: r.get(9),
        created_at: ts(r.get(10)),
    }
}

pub(super) async fn add_trace(pg: &PgStorage, t: TraceInput) -> StorageResult<Option<i64>> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    // A framed pop names partitions by number: its messages' traces do too.
    let pid: uuid::Uuid = match queen_core::storage::partition_number(&t.partition_id) {
        Some(n) => {
            let seq = i64::try_from(n).unwrap_or(i64::MAX);
            match client
                .query_opt(
                    "SELECT id FROM queen.log_partitions WHERE seq = $1",
                    &[&seq],
                )
                .await
                .map_err(pg_err("partition by number"))?
            {
                Some(r) => r.get(0),
                None => return Ok(None),
            }
        }
        None => parse_uuid(&t.partition_id)?,
    };
    let row = client
        .query_opt(
            "WITH m AS (SELECT x.msg_offset FROM queen.log_txids x
                         WHERE x.partition_id = $1 AND x.transaction_id = $2),
                  ins AS (INSERT INTO queen.message_traces
                              (partition_id, transaction_id, msg_offset, consumer_group, event_type, data,
                               worker_id, created_at)
                          SELECT $1, $2, m.msg_offset, $3, $4, $5::text::jsonb, $6, queen.now() FROM m
                          RETURNING id, created_at),
                  names AS (INSERT INTO queen.message_trace_names (trace_id, name, created_at)
                            SELECT ins.id, n, ins.created_at FROM ins, unnest($7::text[]) n
                            ON CONFLICT DO NOTHING RETURNING 1)
             SELECT id FROM ins",
            &[
                &pid,
                &t.transaction_id,
                &t.group,
                &t.event_type,
                &t.data,
                &t.worker_id,
                &t.names,
            ],
        )
        .await
        .map_err(pg_err("add trace"))?;
    Ok(row.map(|r| r.get(0)))
}

pub(super) async fn traces_of(
    pg: &PgStorage,
    partition_id: &str,
    transaction_id: &str,
) -> StorageResult<Vec<TraceRecord>> {
    let pid = parse_uuid(partition_id)?;
    let client = pg.pool.get().await.map_err(pool_err)?;
    let rows = client
        .query(
            &format!(
                "SELECT {TRACE_COLUMNS}
                   FROM queen.message_traces tr
                   JOIN queen.log_partitions p ON p.id = tr.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE tr.partition_id = $1 AND tr.transaction_id = $2
                  ORDER BY tr.id"
            ),
            &[&pid, &transaction_id],
        )
        .await
        .map_err(pg_err("traces of a message"))?;
    Ok(rows.iter().map(trace_from_row).collect())
}

pub(super) async fn traces_named(
    pg: &PgStorage,
    name: &str,
    limit: u32,
    offset: u32,
) -> StorageResult<(Vec<TraceRecord>, u64)> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    let rows = client
        .query(
            &format!(
                "SELECT {TRACE_COLUMNS}
                   FROM queen.message_trace_names n
                   JOIN queen.message_traces tr ON tr.id = n.trace_id
                   JOIN queen.log_partitions p ON p.id = tr.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE n.name = $1
                  ORDER BY n.trace_id DESC
                  LIMIT $2 OFFSET $3"
            ),
            &[&name, &i64::from(limit), &i64::from(offset)],
        )
        .await
        .map_err(pg_err("traces by name"))?;
    let total: i64 = client
        .query_one(
            "SELECT count(*) FROM queen.message_trace_names WHERE name = $1",
            &[&name],
        )
        .await
        .map_err(pg_err("traces by name"))?
        .get(0);
    Ok((rows.iter().map(trace_from_row).collect(), count(total)))
}

pub(super) async fn trace_names(
    pg: &PgStorage,
    limit: u32,
    offset: u32,
) -> StorageResult<(Vec<TraceName>, u64)> {
    let client = pg.pool.get().await.map_err(pool_err)?;
    let rows = client
        .query(
            "SELECT n.name, count(*), count(DISTINCT (tr.partition_id, tr.transaction_id)),
                    max(n.created_at), count(*) OVER ()
               FROM queen.message_trace_names n JOIN queen.message_traces tr ON tr.id = n.trace_id
              GROUP BY n.name
              ORDER BY max(n.created_at) DESC, n.name
              LIMIT $1 OFFSET $2",
            &[&i64::from(limit), &i64::from(offset)],
        )
        .await
        .map_err(pg_err("trace names"))?;
    let total = match rows.first() {
        Some(r) => count(r.get(4)),
        None => {
            let r = client
                .query_one(
                    "SELECT count(DISTINCT name) FROM queen.message_trace_names",
                    &[],
                )
                .await
                .map_err(pg_err("trace names"))?;
            count(r.get(0))
        }
    };
    Ok((
        rows.iter()
            .map(|r| TraceName {
                name: r.get(0),
                traces: count(r.get(1)),
                messages: count(r.get(2)),
                last_seen: ts(r.get(3)),
            })
            .collect(),
        total,
    ))
}
