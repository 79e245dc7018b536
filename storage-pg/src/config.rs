//! Connection settings: DATABASE_URL, or PG_HOST / PG_PORT / PG_USER / PG_PASSWORD / PG_DB, and
//! DB_POOL_SIZE.

use std::str::FromStr;

/// Default pool size: enough for the serving limiter's ceiling plus pushes and acks.
pub const DEFAULT_POOL_SIZE: usize = 32;

#[derive(Clone, Debug)]
pub struct PgConfig {
    pub pg: tokio_postgres::Config,
    pub pool_size: usize,
}

impl PgConfig {
    /// Reads the environment. `None` when no database is configured (no DATABASE_URL and no PG_*
    /// variable): the broker then runs on the in-memory backend.
    pub fn from_env() -> Result<Option<PgConfig>, String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<PgConfig>, String> {
        let pool_size = match get("DB_POOL_SIZE") {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("DB_POOL_SIZE must be a positive integer, got {v:?}"))?,
            None => DEFAULT_POOL_SIZE,
        };
        if let Some(url) = get("DATABASE_URL").filter(|u| !u.is_empty()) {
            let pg = tokio_postgres::Config::from_str(&url)
                .map_err(|e| format!("DATABASE_URL is not a valid PostgreSQL URL: {e}"))?;
            return Ok(Some(PgConfig { pg, pool_size }));
        }
        let keys = ["PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB"];
        if keys.iter().all(|k| get(k).is_none()) {
            return Ok(None);
        }
        let mut pg = tokio_postgres::Config::new();
        pg.host(get("PG_HOST").unwrap_or_else(|| "localhost".into()));
        let port = get("PG_PORT").unwrap_or_else(|| "5432".into());
        pg.port(
            port.parse()
                .map_err(|_| format!("PG_PORT must be a port number, got {port:?}"))?,
        );
        pg.user(get("PG_USER").unwrap_or_else(|| "postgres".into()));
        pg.password(get("PG_PASSWORD").unwrap_or_else(|| "postgres".into()));
        pg.dbname(get("PG_DB").unwrap_or_else(|| "postgres".into()));
        Ok(Some(PgConfig { pg, pool_size }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_configured_means_in_memory() {
        assert!(PgConfig::from_vars(vars(&[])).unwrap().is_none());
    }

    #[test]
    fn url_or_parts() {
        let c = PgConfig::from_vars(vars(&[
            ("DATABASE_URL", "postgres://u@h:5/db"),
            ("DB_POOL_SIZE", "7"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.pool_size, 7);
        assert_eq!(c.pg.get_dbname(), Some("db"));
        let c = PgConfig::from_vars(vars(&[("PG_HOST", "db.local"), ("PG_PORT", "6543")]))
            .unwrap()
            .unwrap();
        assert_eq!(c.pg.get_ports(), &[6543]);
        assert_eq!(c.pg.get_user(), Some("postgres"));
        assert!(PgConfig::from_vars(vars(&[("PG_PORT", "x")])).is_err());
        assert!(PgConfig::from_vars(vars(&[
            ("DATABASE_URL", "postgres://h"),
            ("DB_POOL_SIZE", "0")
        ]))
        .is_err());
    }
}
