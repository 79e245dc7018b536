//! Configuration from the environment, with the variable names Queen's documentation uses.

use queen_core::backoff::WaitBackoff;
use queen_core::limiter::VegasConfig;
use queen_core::params::DEFAULT_TIMEOUT_MS;

pub const HELP: &str = "\
queen: a partitioned FIFO queue broker, wire-compatible with Queen MQ's clients.

USAGE: queen [--help]

Configuration (environment variables):
  HOST                            listen address                       (default 0.0.0.0)
  PORT                            listen port                          (default 6632)
  DATABASE_URL                    PostgreSQL URL, e.g. postgres://user:pass@host:5432/db
  PG_HOST, PG_PORT, PG_USER,      PostgreSQL connection parts, used when DATABASE_URL is unset
  PG_PASSWORD, PG_DB              (defaults localhost, 5432, postgres, postgres, postgres)
  DB_POOL_SIZE                    PostgreSQL connections in the pool   (default 32)
                                  With no DATABASE_URL and no PG_* the broker runs on the
                                  in-memory backend: nothing survives a restart.
  DEFAULT_TIMEOUT                 long-poll timeout (ms) when a pop names none (default 30000)
  POP_WAIT_INITIAL_INTERVAL_MS    re-check interval of a parked pop    (default 100)
  POP_WAIT_BACKOFF_THRESHOLD      re-checks at the initial interval    (default 3)
  POP_WAIT_BACKOFF_MULTIPLIER     growth factor after the threshold    (default 2.0)
  POP_WAIT_MAX_INTERVAL_MS        longest re-check interval            (default 1000)
  QUEEN_HOTLIST                   1: in-memory hot-list ring; 0: SQL candidate scan (default 1)
  QUEEN_VEGAS_INITIAL, QUEEN_VEGAS_MIN, QUEEN_VEGAS_MAX
                                  serving limiter limits               (default 16, 1, 32)
  MAX_BODY_BYTES                  largest accepted request body        (default 33554432)
  RUST_LOG                        log filter                           (default info)
";

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub default_timeout_ms: u64,
    pub backoff: WaitBackoff,
    pub hotlist: bool,
    pub vegas: VegasConfig,
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 6632,
            default_timeout_ms: DEFAULT_TIMEOUT_MS,
            backoff: WaitBackoff::default(),
            hotlist: true,
            vegas: VegasConfig::default(),
            max_body_bytes: 32 * 1024 * 1024,
        }
    }
}

fn parse<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    key: &str,
    default: T,
) -> Result<T, String> {
    match get(key) {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{key} has an invalid value {v:?}")),
    }
}

impl ServerConfig {
    pub fn from_env() -> Result<ServerConfig, String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<ServerConfig, String> {
        let d = ServerConfig::default();
        let backoff = WaitBackoff {
            initial_ms: parse(&get, "POP_WAIT_INITIAL_INTERVAL_MS", d.backoff.initial_ms)?,
            threshold: parse(&get, "POP_WAIT_BACKOFF_THRESHOLD", d.backoff.threshold)?,
            multiplier: parse(&get, "POP_WAIT_BACKOFF_MULTIPLIER", d.backoff.multiplier)?,
            max_ms: parse(&get, "POP_WAIT_MAX_INTERVAL_MS", d.backoff.max_ms)?,
        };
        if backoff.initial_ms == 0
            || backoff.max_ms == 0
            || !(backoff.multiplier.is_finite() && backoff.multiplier > 0.0)
        {
            return Err("POP_WAIT_* intervals must be positive".into());
        }
        let hotlist = match get("QUEEN_HOTLIST").as_deref().map(str::trim) {
            None | Some("") | Some("1") | Some("true") | Some("on") => true,
            Some("0") | Some("false") | Some("off") => false,
            Some(v) => return Err(format!("QUEEN_HOTLIST must be 0 or 1, got {v:?}")),
        };
        let vegas = queen_core::limiter::VegasConfig {
            initial_limit: parse(&get, "QUEEN_VEGAS_INITIAL", d.vegas.initial_limit)?,
            min_limit: parse(&get, "QUEEN_VEGAS_MIN", d.vegas.min_limit)?,
            max_limit: parse(&get, "QUEEN_VEGAS_MAX", d.vegas.max_limit)?,
            ..d.vegas
        };
        Ok(ServerConfig {
            host: get("HOST").filter(|h| !h.is_empty()).unwrap_or(d.host),
            port: parse(&get, "PORT", d.port)?,
            default_timeout_ms: parse(&get, "DEFAULT_TIMEOUT", d.default_timeout_ms)?,
            backoff,
            hotlist,
            vegas,
            max_body_bytes: parse(&get, "MAX_BODY_BYTES", d.max_body_bytes)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = ServerConfig::from_vars(|_| None).unwrap();
        assert_eq!(
            (c.port, c.default_timeout_ms, c.hotlist),
            (6632, 30_000, true)
        );
        assert_eq!(c.backoff, WaitBackoff::default());
        let c = ServerConfig::from_vars(|k| match k {
            "PORT" => Some("7000".into()),
            "QUEEN_HOTLIST" => Some("0".into()),
            "POP_WAIT_MAX_INTERVAL_MS" => Some("500".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.port, c.hotlist, c.backoff.max_ms), (7000, false, 500));
        assert!(ServerConfig::from_vars(|k| (k == "PORT").then(|| "x".into())).is_err());
        assert!(
            ServerConfig::from_vars(|k| (k == "QUEEN_HOTLIST").then(|| "maybe".into())).is_err()
        );
    }
}
