//! Connection settings: a URL, or host / port / user / password / database, and the pool size.

use std::str::FromStr;

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

#[cfg(test)]
mod tests {
    use super::*;

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
