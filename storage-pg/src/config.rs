//! Connection settings: a URL, or host / port / user / password / database, and the pool size.

use std::str::FromStr;

/// Default pool size: enough for the serving limiter's ceiling plus pushes and acks.
pub const DEFAULT_POOL_SIZE: usize = 32;

#[derive(Clone, Debug)]
pub struct PgConfig {
    pub pg: tokio_postgres::Config,
    pub pool_size: usize,
}

/// The connection settings as the operator gives them (the broker reads them with clap, from
/// flags or DATABASE_URL, PG_*, DB_POOL_SIZE).
#[derive(Clone, Debug, Default)]
pub struct PgSettings {
    pub url: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: Option<String>,
    pub pool_size: Option<usize>,
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
        if let Some(url) = s.url.filter(|u| !u.is_empty()) {
            let pg = tokio_postgres::Config::from_str(&url)
                .map_err(|e| format!("DATABASE_URL is not a valid PostgreSQL URL: {e}"))?;
            return Ok(Some(PgConfig { pg, pool_size }));
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
        pg.host(s.host.unwrap_or_else(|| "localhost".into()));
        pg.port(s.port.unwrap_or(5432));
        pg.user(s.user.unwrap_or_else(|| "postgres".into()));
        pg.password(s.password.unwrap_or_else(|| "postgres".into()));
        pg.dbname(s.db.unwrap_or_else(|| "postgres".into()));
        Ok(Some(PgConfig { pg, pool_size }))
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
