//! Mapping PostgreSQL failures to `StorageError`, with context.

use queen_core::storage::StorageError;

/// SQLSTATE classes after which the transaction rolled back and a retry is safe.
fn retryable(code: &str) -> bool {
    // 40: transaction rollback (serialization, deadlock); 53: insufficient resources;
    // 57: operator intervention (cancel, shutdown); 08: connection exception; 55P03: lock timeout.
    code.starts_with("40")
        || code.starts_with("53")
        || code.starts_with("57")
        || code.starts_with("08")
        || code == "55P03"
}

pub fn pg_err(context: &str) -> impl Fn(tokio_postgres::Error) -> StorageError + '_ {
    move |e| match e.as_db_error() {
        Some(db) if retryable(db.code().code()) => StorageError::Unavailable(format!(
            "{context}: {} ({})",
            db.message(),
            db.code().code()
        )),
        Some(db) => StorageError::Internal(format!(
            "{context}: {} ({})",
            db.message(),
            db.code().code()
        )),
        None => StorageError::Unavailable(format!("{context}: {e}")),
    }
}

pub fn pool_err(e: deadpool_postgres::PoolError) -> StorageError {
    StorageError::Unavailable(format!("no database connection: {e}"))
}
