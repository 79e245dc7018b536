//! Connection settings: a URL, or host / port / user / password / database, and the pool size.

use std::str::FromStr;
use std::time::Duration;

use crate::tls::{split_tls_options, SslMode, TlsSettings};

/// Default pool size: enough for the serving limiter's ceiling plus pushes and acks.
pub const DEFAULT_POOL_SIZE: usize = 32;

#[derive(Clone, Debug)]
pub struct PgConfig {
    pub pg: tokio_postgres::Config,
    pub pool_size: usize,
    /// sslmode and sslrootcert (the pool and the LISTEN connection both use them).
    pub tls: TlsSettings,
}

/// The connection settings as the operator gives them (the broker reads them with clap, from
/// flags or DATABASE_URL, PG_*, DB_POOL_SIZE).
#[derive(Clone, Debug)]
pub struct PgSettings {
    pub url: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: Option<String>,
    pub pool_size: Option<usize>,
    /// PG_USE_SSL: TLS required (when the URL names no sslmode).
    pub use_ssl: bool,
    /// PG_SSL_REJECT_UNAUTHORIZED (default true): with PG_USE_SSL, the server's certificate must
    /// chain to a trusted root and name the host (verify-full); false: any (require).
    pub ssl_reject_unauthorized: bool,
    /// PG_SSL_ROOT_CERT: the roots, when the URL names no sslrootcert.
    pub ssl_root_cert: Option<String>,
}

impl Default for PgSettings {
    fn default() -> Self {
        PgSettings {
            url: None,
            host: None,
            port: None,
            user: None,
            password: None,
            db: None,
            pool_size: None,
            use_ssl: false,
            ssl_reject_unauthorized: true,
            ssl_root_cert: None,
        }
    }
}

impl PgConfig {
    /// `None` when no database is configured (no URL and no part): the broker then runs on the
    /// in-memory backend. A URL wins over the parts; missing parts take libpq's usual defaults.
    pub fn from_settings(s: PgSettings) -> Result<Option<PgConfig>, String> {
        let pool_size = match s.pool_size {
            Some(0) => return Err("DB_POOL_SIZE must be a positive integer, got 0".into()),
            Some(n) => n,
            None => DEFAULT_POOL_SIZE,
        };
        let tls_from = |mode: Option<SslMode>, root: Option<String>| {
            let mode = mode.unwrap_or(match (s.use_ssl, s.ssl_reject_unauthorized) {
                (false, _) => SslMode::Prefer,
                (true, true) => SslMode::VerifyFull,
                (true, false) => SslMode::Require,
            });
            TlsSettings {
                mode,
                root_cert: root.or_else(|| s.ssl_root_cert.clone()),
            }
        };
        if let Some(url) = s.url.as_deref().filter(|u| !u.is_empty()) {
            let (rest, mode, root) = split_tls_options(url)?;
            let mut pg = tokio_postgres::Config::from_str(&rest)
                .map_err(|e| format!("DATABASE_URL is not a valid PostgreSQL URL: {e}"))?;
            let tls = tls_from(mode, root);
            pg.ssl_mode(tls.mode.for_driver());
            return Ok(Some(PgConfig { pg, pool_size, tls }));
        }
        if s.host.is_none()
            && s.port.is_none()
            && s.user.is_none()
            && s.password.is_none()
            && s.db.is_none()
        {
            return Ok(None);
        }
        let mut pg = tokio_postgres::Config::new();
        pg.host(s.host.clone().unwrap_or_else(|| "localhost".into()));
        pg.port(s.port.unwrap_or(5432));
        pg.user(s.user.clone().unwrap_or_else(|| "postgres".into()));
        pg.password(s.password.clone().unwrap_or_else(|| "postgres".into()));
        pg.dbname(s.db.clone().unwrap_or_else(|| "postgres".into()));
        let tls = tls_from(None, None);
        pg.ssl_mode(tls.mode.for_driver());
        Ok(Some(PgConfig { pg, pool_size, tls }))
    }
}

/// How long a connection attempt may take before it fails (the pool's creation as well).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sent data may stay unacknowledged, and how soon an idle connection is probed
/// (`KEEPALIVE_IDLE`, then every `KEEPALIVE_INTERVAL`, `KEEPALIVE_RETRIES` times): a database
/// behind a network that drops packets fails its connections in about 30 s, where the kernel's
/// defaults take 15 minutes to two hours and every request on them hangs meanwhile.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_RETRIES: u32 = 3;
/// How long a statement waits for a lock (PostgreSQL's `lock_timeout`) before it fails (503):
/// a table locked by an operator or a stuck session turns into answers clients can retry, not
/// requests that hang while their connections run out. The broker's own waits are a round's
/// row locks (milliseconds); migrations wait as long as they must.
pub const LOCK_TIMEOUT_MS: u64 = 10_000;
/// The `application_name` of the broker's sessions unless the URL names one: in
/// `pg_stat_activity`, and in the snapshot watch's warnings, they are told from other clients'.
pub const APPLICATION_NAME: &str = "queen";
/// tokio-postgres' keepalive idle time when none is given (its `Config::new`).
const DRIVER_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
/// The isolation every broker transaction runs at, whatever the database's or role's
/// `default_transaction_isolation` says: the SQL procedures are written for READ COMMITTED
/// (each statement sees what committed before it; a row lock waits for its holder and then reads
/// the row as committed, under `FOR UPDATE SKIP LOCKED` the claim skips it). Under REPEATABLE
/// READ or SERIALIZABLE, concurrent pushes, pops and acks of one partition fail with 40001
/// instead (seen with a database set to serializable: 503s under eight producers).
const ISOLATION: &str = "SET default_transaction_isolation = 'read committed'";

/// The connection settings with the bounds above wherever the operator's URL gave none
/// (`connect_timeout`, `tcp_user_timeout`, `keepalives_idle`), and `APPLICATION_NAME`. The session's own settings are
/// `session_setup`'s.
pub fn bounded(mut pg: tokio_postgres::Config) -> tokio_postgres::Config {
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(CONNECT_TIMEOUT);
    }
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if pg.get_application_name().is_none() {
        pg.application_name(APPLICATION_NAME);
    }
    if pg.get_keepalives() && pg.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
        pg.keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
    }
    pg
}

/// How long a broker session may sit in a transaction without sending its next statement
/// (PostgreSQL's `idle_in_transaction_session_timeout`) before the server ends the session and
/// rolls the transaction back. A broker frozen mid-transaction (a stopped process, a paused VM,
/// a host that vanished) otherwise keeps its row locks for as long as it stays frozen, or the
/// kernel's two hours for a vanished host, and every push of those partitions, through any
/// broker, answers 503 at `LOCK_TIMEOUT_MS` meanwhile (seen with a broker stopped mid-way
/// through a transaction). Shorter than `LOCK_TIMEOUT_MS`, so a statement that waits on a frozen
/// session's lock gets it instead of failing. The broker's transactions wait between statements
/// for nothing but the database's answers, so a live broker never comes near it.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 5_000;

/// What every pooled session runs before its first use: the isolation the SQL needs
/// (`ISOLATION`, always), and `LOCK_TIMEOUT_MS` and `IDLE_IN_TRANSACTION_TIMEOUT_MS` each unless
/// the URL's `options` set it. Statements, not the `options` startup parameter: PgBouncer
/// refuses that parameter ("unsupported startup parameter: options"), and a broker behind it
/// could not connect.
pub fn session_setup(pg: &tokio_postgres::Config) -> String {
    let options = pg.get_options().unwrap_or_default();
    let mut setup = format!("{ISOLATION};");
    for (name, ms) in [
        ("lock_timeout", LOCK_TIMEOUT_MS),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT_MS,
        ),
    ] {
        if !options.contains(name) {
            setup.push_str(&format!(" SET {name} = {ms};"));
        }
    }
    setup
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_unless_the_url_says_otherwise() {
        let url = |u: &str| bounded(tokio_postgres::Config::from_str(u).unwrap());
        let c = url("postgres://h/db");
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(c.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(
            c.get_options(),
            None,
            "no startup options: PgBouncer refuses them"
        );
        assert_eq!(c.get_application_name(), Some(APPLICATION_NAME));
        let c = url("postgres://h/db?connect_timeout=3&keepalives_idle=60&application_name=q1");
        assert_eq!(c.get_application_name(), Some("q1"));
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(60));
    }

    #[test]
    fn sessions_set_the_isolation_always_and_their_timeouts_unless_the_url_does() {
        let setup = |u: &str| session_setup(&tokio_postgres::Config::from_str(u).unwrap());
        let isolation = "SET default_transaction_isolation = 'read committed';";
        let lock = " SET lock_timeout = 10000;";
        let idle = " SET idle_in_transaction_session_timeout = 5000;";
        assert_eq!(setup("postgres://h/db"), format!("{isolation}{lock}{idle}"));
        assert_eq!(
            setup("postgres://h/db?options=-c%20work_mem%3D8MB"),
            format!("{isolation}{lock}{idle}")
        );
        assert_eq!(
            setup("postgres://h/db?options=-c%20lock_timeout%3D0%20-c%20work_mem%3D8MB"),
            format!("{isolation}{idle}")
        );
        assert_eq!(
            setup("postgres://h/db?options=-c%20idle_in_transaction_session_timeout%3D0"),
            format!("{isolation}{lock}")
        );
        // An isolation in the URL's options does not survive: the setup runs after them.
        assert!(
            setup("postgres://h/db?options=-c%20default_transaction_isolation%3Dserializable")
                .starts_with(isolation)
        );
    }

    #[test]
    fn nothing_configured_means_in_memory() {
        assert!(PgConfig::from_settings(PgSettings::default())
            .unwrap()
            .is_none());
    }

    #[test]
    fn tls_from_the_url_or_queens_settings() {
        let url = |u: &str, use_ssl: bool, reject: bool| {
            PgConfig::from_settings(PgSettings {
                url: Some(u.into()),
                use_ssl,
                ssl_reject_unauthorized: reject,
                ssl_root_cert: Some("/etc/ca.pem".into()),
                ..PgSettings::default()
            })
            .unwrap()
            .unwrap()
        };
        let c = url("postgres://h/db", false, true);
        assert_eq!(c.tls.mode, SslMode::Prefer);
        assert_eq!(
            url("postgres://h/db", true, true).tls.mode,
            SslMode::VerifyFull
        );
        assert_eq!(
            url("postgres://h/db", true, false).tls.mode,
            SslMode::Require
        );
        let c = url(
            "postgres://h/db?sslmode=verify-ca&sslrootcert=/ca.pem",
            true,
            true,
        );
        assert_eq!(
            (c.tls.mode, c.tls.root_cert.as_deref()),
            (SslMode::VerifyCa, Some("/ca.pem"))
        );
        assert_eq!(
            c.pg.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(
            url("postgres://h/db?sslmode=disable", true, true)
                .pg
                .get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
        assert_eq!(c.tls.root_cert.as_deref(), Some("/ca.pem"));
        assert_eq!(
            url("postgres://h/db", false, true).tls.root_cert.as_deref(),
            Some("/etc/ca.pem")
        );
    }

    #[test]
    fn url_or_parts() {
        let c = PgConfig::from_settings(PgSettings {
            url: Some("postgres://u@h:5/db".into()),
            pool_size: Some(7),
            ..PgSettings::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(c.pool_size, 7);
        assert_eq!(c.pg.get_dbname(), Some("db"));
        let c = PgConfig::from_settings(PgSettings {
            host: Some("db.local".into()),
            port: Some(6543),
            ..PgSettings::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(c.pg.get_ports(), &[6543]);
        assert_eq!(c.pg.get_user(), Some("postgres"));
        assert!(PgConfig::from_settings(PgSettings {
            url: Some("postgres://h".into()),
            pool_size: Some(0),
            ..PgSettings::default()
        })
        .is_err());
        assert!(PgConfig::from_settings(PgSettings {
            url: Some("not a url".into()),
            ..PgSettings::default()
        })
        .is_err());
    }
}
