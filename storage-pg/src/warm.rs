//! Warm-up of a new pool connection. A PostgreSQL backend compiles each PL/pgSQL function, loads
//! the catalog entries of every table and index it touches and plans each statement the first
//! time it runs one, and keeps all of it for the connection's life. A group's first contact was
//! the first call of the wildcard scan on most connections, and paid it: in psql, the first
//! `log_pop_wildcard_v1` of a session took 16-26 ms where the next group's took 6-8 ms
//! (docs/benchmarks.md, "First contact on a cold connection"). So each connection runs the
//! push and the first contact once, on a scratch queue of its own, in a transaction it rolls
//! back: nothing of it is ever visible, and its NOTIFYs are never sent.

use queen_core::frames::{build_blob, Frame};

/// Runs the warm-up; best effort: a connection that cannot be warmed (a database whose
/// migrations have not run yet) is still a good connection, only a cold one.
pub(crate) async fn warm_connection(client: &mut tokio_postgres::Client) {
    if let Err(e) = run(client).await {
        tracing::debug!("connection warm-up skipped: {e}");
    }
}

/// The warm-up itself, its failure told (the pool's hook logs it and goes on).
pub(crate) async fn run(client: &mut tokio_postgres::Client) -> Result<(), String> {
    let scratch = format!("__warm-{}", uuid::Uuid::now_v7());
    let frame = Frame {
        producer: None,
        encrypted: false,
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "warm".into(),
        trace_id: None,
        payload: b"{}".to_vec(),
    };
    let blob = build_blob(std::slice::from_ref(&frame)).map_err(|e| format!("blob: {e:?}"))?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| format!("begin: {e}"))?;
    let txids = vec![frame.transaction_id.clone()];
    let ids = vec![frame.message_id];
    let no_time: Option<std::time::SystemTime> = None;
    tx.query(
        "SELECT * FROM queen.push_v6($1, 'p', $2, $3, $4, $5, NULL, true)",
        &[&scratch, &txids, &ids, &blob, &no_time],
    )
    .await
    .map_err(|e| format!("push: {e}"))?;
    let (no_text, no_from): (Option<String>, Option<std::time::SystemTime>) = (None, None);
    tx.query(
        "SELECT * FROM queen.log_pop_wildcard_v1($1, 'warm', $2, 10, 1, false, 30, $3, $4, false)",
        &[&scratch, &uuid::Uuid::now_v7(), &no_text, &no_from],
    )
    .await
    .map_err(|e| format!("first contact: {e}"))?;
    tx.rollback().await.map_err(|e| format!("rollback: {e}"))
}
