//! Mapping PostgreSQL failures to `StorageError` by SQLSTATE class, with context: what the client
//! caused is a 4xx, what the database's availability caused is a 503 (retry later), and only the
//! broker's own mistakes are internal errors.

use std::future::Future;

use queen_core::storage::{StorageError, StorageResult};

/// What a SQLSTATE says about whose the failure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// 22xxx data exception: a value the client sent that the column cannot hold.
    BadData,
    /// 23xxx integrity constraint violation.
    Conflict,
    /// 40001 serialization failure, 40P01 deadlock: rolled back; running again may succeed.
    Contention,
    /// The database is unavailable: connection exceptions (08xxx), shutdown and restart
    /// (57P01-57P03), too many connections (53300) and other resource limits (53xxx), a
    /// cancelled or timed-out statement (57014), a lock timeout (55P03), any other rollback (40xxx),
    /// writes refused for now (25006), a session ended in its transaction (25P03, 25P04).
    Unavailable,
    /// Anything else: the broker's statement or schema is wrong.
    Internal,
}

fn class(code: &str) -> Class {
    match code {
        "40001" | "40P01" => Class::Contention,
        // A lock timeout; a database that refuses writes for now (default_transaction_read_only
        // set by an operator or a managed service whose storage filled, or a connection that
        // reached a standby): it ends without the broker doing anything, as an outage does.
        // A session the server ended for idling in a transaction (25P03; PostgreSQL 17's
        // transaction_timeout, 25P04): its transaction was rolled back, as in a lost connection.
        "55P03" | "25006" | "25P03" | "25P04" => Class::Unavailable,
        c if c.starts_with("22") => Class::BadData,
        c if c.starts_with("23") => Class::Conflict,
        c if c.starts_with("08")
            || c.starts_with("53")
            || c.starts_with("57")
            || c.starts_with("40") =>
        {
            Class::Unavailable
        }
        _ => Class::Internal,
    }
}

/// push_v6's refusal of plaintext payloads for a queue with encryptionEnabled (its message is
/// the queue's name).
const ENCRYPTION_REQUIRED: &str = "QE001";

/// A statement the connection prepared is not there: the connection is not one session, which
/// is what a pooler in transaction mode (PgBouncer's `pool_mode = transaction`) does.
const PREPARED_STATEMENT_GONE: &str = "26000";
const TRANSACTION_POOLING_HINT: &str = "; is a pooler in transaction mode between the broker \
     and PostgreSQL? The broker prepares statements and listens on its sessions: connect it \
     directly or through session pooling";

pub fn pg_err(context: &str) -> impl Fn(tokio_postgres::Error) -> StorageError + '_ {
    move |e| match e.as_db_error() {
        Some(db) if db.code().code() == ENCRYPTION_REQUIRED => StorageError::EncryptionRequired {
            queue: db.message().to_string(),
        },
        Some(db) => {
            let mut text = format!("{context}: {} ({})", db.message(), db.code().code());
            if db.code().code() == PREPARED_STATEMENT_GONE {
                text.push_str(TRANSACTION_POOLING_HINT);
            }
            match class(db.code().code()) {
                Class::BadData => StorageError::Invalid(text),
                Class::Conflict => StorageError::Conflict(text),
                Class::Contention => StorageError::Contention(text),
                Class::Unavailable => StorageError::Unavailable(text),
                Class::Internal => StorageError::Internal(text),
            }
        }
        // No database error: the connection broke or could not be made.
        None => StorageError::Unavailable(format!("{context}: {e}{}", causes(&e))),
    }
}

pub fn pool_err(e: deadpool_postgres::PoolError) -> StorageError {
    StorageError::Unavailable(format!("no database connection: {e}{}", why_not(&e)))
}

/// Why a connection could not be made or set up, beyond the driver's summary: the server's (or
/// a pooler's) refusal, which tokio-postgres shows only as "db error", or the cause of a
/// connection that was never made (a host name that does not resolve, a refused port, a
/// timeout), which it shows only as "error connecting to server".
fn why_not(e: &deadpool_postgres::PoolError) -> String {
    let Some(pg) = connection_error(e) else {
        return String::new();
    };
    match pg.as_db_error() {
        Some(db) => format!(": {} ({})", db.message(), db.code().code()),
        None => causes(pg),
    }
}

/// The error's sources that its own text does not already say, each after ": ".
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut said = e.to_string();
    let start = said.len();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !said.contains(&text) {
            said.push_str(": ");
            said.push_str(&text);
        }
        source = s.source();
    }
    said.split_off(start)
}

/// The driver's error of a connection that could not be made or set up (config::session_setup
/// fails as a connection does).
fn connection_error(e: &deadpool_postgres::PoolError) -> Option<&tokio_postgres::Error> {
    use deadpool_postgres::{HookError, PoolError};
    match e {
        PoolError::Backend(pg) | PoolError::PostCreateHook(HookError::Backend(pg)) => Some(pg),
        _ => None,
    }
}

/// The broker's first connection at start: `Unavailable` when the database is not up yet (refused,
/// unreachable, timed out, starting up or shutting down, out of connections), which is worth
/// waiting for; `Internal` when a setting is wrong (the password, the database's name, a
/// certificate TLS refuses), which fails the same way however long one waits.
pub fn first_connection_err(e: deadpool_postgres::PoolError) -> StorageError {
    use deadpool_postgres::PoolError;
    let not_up_yet = match (&e, connection_error(&e)) {
        (PoolError::Timeout(_), _) => true,
        // PgBouncer answers 08P01 both when the database behind it is down and when it refuses
        // a setting: waited for, with its message in the log.
        (_, Some(pg)) => match pg.as_db_error() {
            Some(db) => class(db.code().code()) == Class::Unavailable,
            None => !refused_by_tls(pg),
        },
        _ => false,
    };
    let said = why_not(&e);
    if not_up_yet {
        StorageError::Unavailable(format!("no database connection: {e}{said}"))
    } else {
        StorageError::Internal(format!("cannot connect to PostgreSQL: {e}{said}"))
    }
}

/// Whether a connection failed in its TLS handshake: tokio-postgres reports a server without TLS
/// as a TLS error, and tokio-rustls a refused certificate as an `InvalidData` I/O error.
fn refused_by_tls(e: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<rustls::Error>().is_some()
            || s.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
        {
            return true;
        }
        source = s.source();
    }
    e.to_string().contains("TLS")
}

/// How many times a transaction that lost to a concurrent one (serialization failure, deadlock)
/// runs in all before the broker answers 503.
pub const CONTENTION_ATTEMPTS: u32 = 3;

/// Runs `op` again while it fails with `Contention` (it rolled back, so running it again is
/// safe), up to `CONTENTION_ATTEMPTS` in all.
pub async fn retry_contention<T, F, Fut>(mut op: F) -> StorageResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<T>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(StorageError::Contention(e)) if attempt < CONTENTION_ATTEMPTS => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "storage contention; running again");
            }
            other => return other,
        }
    }
}

/// A statement prepared once per connection and kept: a query sent as text is parsed, planned
/// and described on every call, a round trip more than a prepared one.
pub(crate) async fn prepared<C: deadpool_postgres::GenericClient + ?Sized>(
    client: &C,
    sql: &str,
) -> StorageResult<tokio_postgres::Statement> {
    client
        .prepare_cached(sql)
        .await
        .map_err(pg_err("prepare a statement"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_whose_failure_it_is() {
        assert_eq!(
            class("22021"),
            Class::BadData,
            "invalid byte sequence (NUL)"
        );
        assert_eq!(class("22P02"), Class::BadData);
        assert_eq!(class("23505"), Class::Conflict);
        assert_eq!(class("40001"), Class::Contention);
        assert_eq!(class("40P01"), Class::Contention);
        assert_eq!(class("08006"), Class::Unavailable);
        assert_eq!(class("57P01"), Class::Unavailable, "admin shutdown");
        assert_eq!(class("57P03"), Class::Unavailable, "cannot connect now");
        assert_eq!(class("53300"), Class::Unavailable, "too many connections");
        assert_eq!(class("57014"), Class::Unavailable, "statement timeout");
        assert_eq!(class("25006"), Class::Unavailable, "read-only for now");
        assert_eq!(
            class("25P03"),
            Class::Unavailable,
            "ended idle in a transaction"
        );
        assert_eq!(class("42P01"), Class::Internal, "our schema is wrong");
    }

    /// A connection that was never made says why (the driver's own text is only "error
    /// connecting to server"), and is waited for at start.
    #[tokio::test]
    async fn a_connection_never_made_says_why() {
        let closed_port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut cfg = deadpool_postgres::Config::new();
        cfg.host = Some("127.0.0.1".into());
        cfg.port = Some(closed_port);
        cfg.user = Some("postgres".into());
        cfg.dbname = Some("postgres".into());
        let pool = cfg
            .create_pool(
                Some(deadpool_postgres::Runtime::Tokio1),
                tokio_postgres::NoTls,
            )
            .unwrap();
        let Err(e) = pool.get().await else {
            panic!("nothing listens there")
        };
        match first_connection_err(e) {
            StorageError::Unavailable(text) => {
                assert!(text.contains("error connecting to server: "), "{text}");
                assert!(text.to_lowercase().contains("refused"), "{text}");
            }
            other => panic!("a refused port is waited for: {other:?}"),
        }
    }

    #[tokio::test]
    async fn contention_is_retried_a_bounded_number_of_times() {
        let mut calls = 0;
        let r: StorageResult<()> = retry_contention(|| {
            calls += 1;
            async { Err(StorageError::Contention("deadlock".into())) }
        })
        .await;
        assert!(matches!(r, Err(StorageError::Contention(_))));
        assert_eq!(calls, CONTENTION_ATTEMPTS);
        let mut calls = 0;
        let r = retry_contention(|| {
            calls += 1;
            let n = calls;
            async move {
                if n < 2 {
                    Err(StorageError::Contention("serialization".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r, Ok(2));
    }
}
