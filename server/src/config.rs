//! Configuration from flags or the environment, with the variable names Queen's documentation
//! uses. clap (with its env feature) reads both and generates `--help`.

use std::sync::Arc;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, CommandFactory, Parser};
use queen_core::backoff::WaitBackoff;
use queen_core::limiter::LimiterConfig;
use queen_core::params::DEFAULT_TIMEOUT_MS;
use queen_storage_pg::{PgConfig, PgSettings};

use crate::buffer::FileBuffer;
use crate::http::auth::{self, AuthSettings, Authenticator, JwtAlgorithm};
use crate::sealing::PayloadCipher;

/// The serving limiter's settings while it was a Vegas limiter; a broker refuses to start with
/// one of them set rather than run without the bound it names.
const RENAMED_LIMITER_SETTINGS: [&str; 3] =
    ["QUEEN_VEGAS_INITIAL", "QUEEN_VEGAS_MIN", "QUEEN_VEGAS_MAX"];

/// Refuses a renamed limiter setting (`is_set` looks a name up in the environment): not ignored
/// silently, the operator meant to bound the limiter.
fn renamed_limiter_setting(is_set: impl Fn(&str) -> bool) -> Result<(), String> {
    match RENAMED_LIMITER_SETTINGS.iter().find(|name| is_set(name)) {
        Some(old) => Err(format!(
            "{old} is no longer read: the serving limiter's bounds are QUEEN_LIMITER_INITIAL, \
             QUEEN_LIMITER_MIN and QUEEN_LIMITER_MAX"
        )),
        None => Ok(()),
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub default_timeout_ms: u64,
    pub backoff: WaitBackoff,
    pub hotlist: bool,
    pub limiter: LimiterConfig,
    pub max_body_bytes: usize,
    /// How long a connection may go without a byte of what the client owes: the next request's
    /// head (on a new or idle keep-alive connection), more of a request body, or reading more of
    /// its answer. Past it the connection is closed (a body answers 408 first). 0: wait for ever.
    pub client_idle_timeout_ms: u64,
    /// How long a request's own work (a long-poll's parking aside, and counted from when its
    /// body has arrived), or one storage call of a pop, may take before it answers 503
    /// (`STORAGE_DEADLINE`; tests shorten it).
    pub storage_deadline_ms: u64,
    /// The push failover buffer, when FILE_BUFFER_DIR is set.
    pub file_buffer: Option<Arc<FileBuffer>>,
    pub retention: RetentionSettings,
    /// JWT authentication, when JWT_ENABLED.
    pub auth: Option<Arc<Authenticator>>,
    /// The payload key, when QUEEN_ENCRYPTION_KEY is set.
    pub cipher: Option<Arc<PayloadCipher>>,
    /// Milliseconds between the broker's samples for the status routes (0: none).
    pub sample_interval_ms: u64,
    /// Per-partition lag series at most, per scrape of /metrics/prometheus.
    pub metrics_partition_series: usize,
    /// Milliseconds between passes that warm idle PostgreSQL connections (0: none).
    pub pg_warm_interval_ms: u64,
    /// Milliseconds between passes that analyze queen tables grown past their statistics (0:
    /// none).
    pub pg_stats_interval_ms: u64,
    /// Ring-pop statements in flight at once per (queue, first candidate partition); pops beyond
    /// them share the next statement (0: every pop its own statement).
    pub pop_rounds: usize,
    /// Push statements in flight at once; pushes arriving beyond them go together in the next
    /// (0: every push its own statement).
    pub push_rounds: usize,
    /// Admin totals are computed afresh for each request while the last pass read fewer
    /// partitions than this; past it they come from a snapshot (`stats`). 0: always from the
    /// snapshot.
    pub admin_inline_partitions: u64,
    /// The deepest partitions each admin-totals pass keeps, which a `minDepth` partition
    /// listing answers from without reading partitions itself.
    pub admin_deepest_partitions: usize,
    /// How long a totals request waits for a pass when the broker has no snapshot to answer
    /// (none of its own, none stored) before it answers 503; the pass goes on.
    pub admin_totals_wait_ms: u64,
    /// Payload bytes every ephemeral queue of this broker may hold together.
    pub ephemeral_max_bytes: u64,
    /// The host:port other brokers of the deployment reach this one at (ephemeral queues'
    /// owners take their queues' calls). `None`: no peers (the embedded in-memory mode).
    pub peer_address: Option<String>,
    /// Sizes the KV and locks surfaces accept.
    pub kv_limits: queen_core::kv::KvLimits,
}

/// Default POP_ROUNDS.
pub const DEFAULT_POP_ROUNDS: usize = 1;
/// See `ServerConfig::push_rounds` (docs/benchmarks.md, "Push rounds").
pub const DEFAULT_PUSH_ROUNDS: usize = 2;

/// Default ADMIN_INLINE_PARTITIONS: a pass over 2,000 partitions takes about 20 ms on PostgreSQL
/// (release build, 2 cores), so no request waits longer for exact totals; a count, not a time,
/// so whether a request runs a pass does not change with the machine's load.
pub const DEFAULT_ADMIN_INLINE_PARTITIONS: u64 = 2_000;
/// Default ADMIN_DEEPEST_PARTITIONS: about 6 MB of partition views (each with its cursors;
/// measured, docs/operations.md), and more rows than a dashboard pages through.
pub const DEFAULT_ADMIN_DEEPEST_PARTITIONS: usize = 10_000;
/// Default ADMIN_TOTALS_WAIT_MS: under common proxies' and Prometheus' timeouts (10 s and up),
/// so they get an answer instead of a dropped connection.
pub const DEFAULT_ADMIN_TOTALS_WAIT_MS: u64 = 5_000;
/// Default EPHEMERAL_MAX_BYTES: 256 MiB of payloads.
pub const DEFAULT_EPHEMERAL_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Default PG_WARM_INTERVAL_MS.
pub const DEFAULT_PG_WARM_INTERVAL_MS: u64 = 1000;

/// Default CLIENT_IDLE_TIMEOUT_MS: longer than clients and the common load balancers keep an idle
/// connection to a server (httpx 5 s, undici 4 s; AWS's ALB 60 s, nginx's upstream keepalive
/// 60 s), so none of them sends a request on a connection the broker is closing (a balancer
/// answers its client 502 then); nginx's own client timeouts are 60-75 s.
pub const DEFAULT_CLIENT_IDLE_TIMEOUT_MS: u64 = 75_000;

/// Default PG_STATS_INTERVAL_MS.
pub const DEFAULT_PG_STATS_INTERVAL_MS: u64 = 5000;
/// How long a request's own work (a long-poll's parking aside), or one storage call of a pop,
/// may take before the broker gives up on it and answers 503 (the default of
/// `ServerConfig::storage_deadline_ms`): a database that stopped answering without closing its
/// connections (a stalled disk, a frozen host) otherwise held every request on it, `/health`
/// included, for as long as it stayed so. Long enough for the slowest legitimate request (a
/// forced admin pass at millions of partitions runs on in the background anyway). A request's
/// body arriving is the client's part, not storage's: the deadline counts from its end, and a
/// stalled body is the client-idle timeout's (408).
pub const STORAGE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
const DEFAULT_STORAGE_DEADLINE_MS: u64 = STORAGE_DEADLINE.as_millis() as u64;

impl ServerConfig {
    /// `storage_deadline_ms` as a duration.
    pub fn storage_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.storage_deadline_ms)
    }

    /// `client_idle_timeout_ms` as a duration; `None`: wait for ever.
    pub fn client_idle_timeout(&self) -> Option<std::time::Duration> {
        (self.client_idle_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.client_idle_timeout_ms))
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 6632,
            default_timeout_ms: DEFAULT_TIMEOUT_MS,
            backoff: WaitBackoff::default(),
            hotlist: true,
            limiter: LimiterConfig::default(),
            max_body_bytes: 32 * 1024 * 1024,
            client_idle_timeout_ms: DEFAULT_CLIENT_IDLE_TIMEOUT_MS,
            storage_deadline_ms: DEFAULT_STORAGE_DEADLINE_MS,
            kv_limits: queen_core::kv::KvLimits::default(),
            file_buffer: None,
            retention: RetentionSettings::default(),
            auth: None,
            cipher: None,
            sample_interval_ms: 60_000,
            metrics_partition_series: 1000,
            pg_warm_interval_ms: DEFAULT_PG_WARM_INTERVAL_MS,
            pg_stats_interval_ms: DEFAULT_PG_STATS_INTERVAL_MS,
            pop_rounds: DEFAULT_POP_ROUNDS,
            push_rounds: DEFAULT_PUSH_ROUNDS,
            admin_inline_partitions: DEFAULT_ADMIN_INLINE_PARTITIONS,
            admin_deepest_partitions: DEFAULT_ADMIN_DEEPEST_PARTITIONS,
            admin_totals_wait_ms: DEFAULT_ADMIN_TOTALS_WAIT_MS,
            ephemeral_max_bytes: DEFAULT_EPHEMERAL_MAX_BYTES,
            peer_address: None,
        }
    }
}

/// Every setting, from a flag or its environment variable (the names Queen's documentation
/// uses). clap generates `--help` from these declarations, so it cannot drift from them.
#[derive(Parser, Debug)]
#[command(
    name = "queen",
    version,
    about = "A partitioned FIFO queue broker, wire-compatible with Queen MQ's clients.",
    after_help = "With no DATABASE_URL and no PG_* setting the broker runs on the in-memory \
                  backend: nothing survives a restart. RUST_LOG sets the log filter (default info)."
)]
pub struct Settings {
    /// Listen address.
    #[arg(long, env = "HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// Listen port.
    #[arg(long, env = "PORT", default_value_t = 6632)]
    pub port: u16,
    /// PostgreSQL URL, e.g. postgres://user:pass@host:5432/db.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// PostgreSQL host, when no URL is given (default localhost).
    #[arg(long, env = "PG_HOST")]
    pub pg_host: Option<String>,
    /// PostgreSQL port, when no URL is given (default 5432).
    #[arg(long, env = "PG_PORT")]
    pub pg_port: Option<u16>,
    /// PostgreSQL user, when no URL is given (default postgres).
    #[arg(long, env = "PG_USER")]
    pub pg_user: Option<String>,
    /// PostgreSQL password, when no URL is given (default postgres).
    #[arg(long, env = "PG_PASSWORD", hide_env_values = true)]
    pub pg_password: Option<String>,
    /// PostgreSQL database, when no URL is given (default postgres).
    #[arg(long, env = "PG_DB")]
    pub pg_db: Option<String>,
    /// TLS to PostgreSQL required, when DATABASE_URL names no sslmode (else libpq's default,
    /// prefer: TLS when the server offers it).
    #[arg(long, env = "PG_USE_SSL", default_value = "false",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub pg_use_ssl: bool,
    /// With PG_USE_SSL: the server's certificate must chain to a trusted root and name the host
    /// (sslmode verify-full); false: any certificate (require).
    #[arg(long, env = "PG_SSL_REJECT_UNAUTHORIZED", default_value = "true",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub pg_ssl_reject_unauthorized: bool,
    /// PEM file of the roots PostgreSQL's certificate must chain to (libpq's sslrootcert, which
    /// DATABASE_URL may also name); unset: the webpki roots.
    #[arg(long, env = "PG_SSL_ROOT_CERT")]
    pub pg_ssl_root_cert: Option<String>,
    /// Milliseconds between passes that warm idle pool connections: each runs a push and a first
    /// contact once, rolled back, so a new group's first pop does not pay a cold backend's
    /// compiles and catalog reads. A pass borrows only connections nobody waits for. 0: off.
    #[arg(long, env = "PG_WARM_INTERVAL_MS", default_value_t = DEFAULT_PG_WARM_INTERVAL_MS)]
    pub pg_warm_interval_ms: u64,
    /// Milliseconds between passes that ANALYZE every queen table whose pages more than doubled
    /// since its statistics were taken, so no session keeps a plan made when the table was tiny
    /// (autovacuum gets there only at its next round). Brokers on one database take turns. 0: off.
    #[arg(long, env = "PG_STATS_INTERVAL_MS", default_value_t = DEFAULT_PG_STATS_INTERVAL_MS)]
    pub pg_stats_interval_ms: u64,
    /// Ring-pop statements in flight at once per partition (a pop's first candidate). Pops of
    /// other groups for it that arrive while that many are running wait and go together in the
    /// next, one statement (one transaction) for all: a push read by many groups wakes a pop of
    /// each at the same moment. A second pop of the same group, or a pop of another partition,
    /// does not wait. 0: every pop its own statement.
    #[arg(long, env = "POP_ROUNDS", default_value_t = DEFAULT_POP_ROUNDS)]
    pub pop_rounds: usize,
    /// Push statements in flight at once. Pushes (of any producers, queues and partitions) that
    /// arrive while that many are running wait and go together in the next, one statement (one
    /// transaction, one commit) for all; each keeps its own answer, and a round that cannot
    /// commit whole sends its pushes one by one. 0: every push its own statement.
    #[arg(long, env = "PUSH_ROUNDS", default_value_t = DEFAULT_PUSH_ROUNDS)]
    pub push_rounds: usize,
    /// The admin totals (queue listings, overview, status, consumer groups, the metrics' queue
    /// series) are computed afresh for each request while the database holds fewer partitions
    /// than this (as the last pass counted them). Past it they come from the last pass, which a
    /// background pass renews while they are read (pausing nine times a pass's length; the
    /// brokers of a deployment take turns and store each pass for the others and for restarts),
    /// and each answer says its statsAge. 0: always from the last pass.
    #[arg(
        long,
        env = "ADMIN_INLINE_PARTITIONS",
        default_value_t = DEFAULT_ADMIN_INLINE_PARTITIONS
    )]
    pub admin_inline_partitions: u64,
    /// The deepest partitions (those with the most pending for their slowest group) each pass
    /// of the admin totals keeps: GET /api/v1/resources/partitions?minDepth answers from them
    /// and says truncated when the pass left out a partition at least that deep.
    #[arg(
        long,
        env = "ADMIN_DEEPEST_PARTITIONS",
        default_value_t = DEFAULT_ADMIN_DEEPEST_PARTITIONS
    )]
    pub admin_deepest_partitions: usize,
    /// Milliseconds a totals request waits for a pass when the broker has none to answer from
    /// (its first over a large database that no broker has stored a pass of) before it answers
    /// 503 with Retry-After; the pass goes on, and answers once it is done.
    #[arg(
        long,
        env = "ADMIN_TOTALS_WAIT_MS",
        default_value_t = DEFAULT_ADMIN_TOTALS_WAIT_MS
    )]
    pub admin_totals_wait_ms: u64,
    /// Payload bytes all ephemeral queues of this broker may hold together; a push past it is
    /// refused with 503 ephemeral_budget_exhausted (each queue's own maxBytes and maxLength
    /// apply first, with its policy).
    #[arg(long, env = "EPHEMERAL_MAX_BYTES", default_value_t = DEFAULT_EPHEMERAL_MAX_BYTES)]
    pub ephemeral_max_bytes: u64,
    /// With PostgreSQL: the host:port the other brokers of the deployment reach this one at. An
    /// ephemeral queue's ring lives in one broker and the others forward its calls there.
    /// Default 127.0.0.1:PORT, right for brokers on one host; set it when they are on several.
    #[arg(long, env = "PEER_ADDRESS")]
    pub peer_address: Option<String>,
    /// PostgreSQL connections in the pool [default: 32].
    #[arg(long, env = "DB_POOL_SIZE")]
    pub db_pool_size: Option<usize>,
    /// Long-poll timeout (ms) when a pop names none.
    #[arg(long, env = "DEFAULT_TIMEOUT", default_value_t = DEFAULT_TIMEOUT_MS)]
    pub default_timeout: u64,
    /// Re-check interval (ms) of a parked pop.
    #[arg(long, env = "POP_WAIT_INITIAL_INTERVAL_MS", default_value_t = WaitBackoff::default().initial_ms)]
    pub pop_wait_initial_interval_ms: u64,
    /// Re-checks at the initial interval before the backoff grows.
    #[arg(long, env = "POP_WAIT_BACKOFF_THRESHOLD", default_value_t = WaitBackoff::default().threshold)]
    pub pop_wait_backoff_threshold: u32,
    /// Growth factor of the re-check interval after the threshold.
    #[arg(long, env = "POP_WAIT_BACKOFF_MULTIPLIER", default_value_t = WaitBackoff::default().multiplier)]
    pub pop_wait_backoff_multiplier: f64,
    /// Longest re-check interval (ms).
    #[arg(long, env = "POP_WAIT_MAX_INTERVAL_MS", default_value_t = WaitBackoff::default().max_ms)]
    pub pop_wait_max_interval_ms: u64,
    /// 1: the in-memory hot-list ring picks candidates; 0: the SQL candidate scan.
    #[arg(long = "hotlist", env = "QUEEN_HOTLIST", default_value = "1",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub hotlist: bool,
    /// Serving limiter: initial concurrency limit.
    #[arg(long, env = "QUEEN_LIMITER_INITIAL", default_value_t = LimiterConfig::default().initial_limit)]
    pub limiter_initial: u32,
    /// Serving limiter: lowest limit.
    #[arg(long, env = "QUEEN_LIMITER_MIN", default_value_t = LimiterConfig::default().min_limit)]
    pub limiter_min: u32,
    /// Serving limiter: highest limit.
    #[arg(long, env = "QUEEN_LIMITER_MAX", default_value_t = LimiterConfig::default().max_limit)]
    pub limiter_max: u32,
    /// Operations per KV, locks or timers call (and per transaction rider).
    #[arg(long, env = "KV_MAX_OPERATIONS", default_value_t = queen_core::kv::KvLimits::default().max_ops)]
    pub kv_max_operations: usize,
    /// Largest KV key (bytes).
    #[arg(long, env = "KV_MAX_KEY_BYTES", default_value_t = queen_core::kv::KvLimits::default().max_key_bytes)]
    pub kv_max_key_bytes: usize,
    /// Largest KV value (bytes of its JSON text).
    #[arg(long, env = "KV_MAX_VALUE_BYTES", default_value_t = queen_core::kv::KvLimits::default().max_value_bytes)]
    pub kv_max_value_bytes: usize,
    /// Largest accepted request body (bytes).
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = ServerConfig::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Milliseconds a connection may go without a byte of what its client owes (the next
    /// request's head on a new or idle keep-alive connection, more of a request body, or reading
    /// more of its answer) before the broker closes it; a stalled body answers 408 first. A
    /// long-poll waiting for its answer is not idle. 0: wait for ever.
    #[arg(long, env = "CLIENT_IDLE_TIMEOUT_MS", default_value_t = DEFAULT_CLIENT_IDLE_TIMEOUT_MS)]
    pub client_idle_timeout_ms: u64,
    /// Push failover buffer directory: pushes accepted while PostgreSQL is unreachable (or in push
    /// maintenance mode) are written here, fsync'd, answered `buffered` and stored once it is back.
    /// Unset: no buffer (such pushes answer 503).
    #[arg(long, env = "FILE_BUFFER_DIR")]
    pub file_buffer_dir: Option<std::path::PathBuf>,
    /// Milliseconds between retention passes (retentionSeconds, completedRetentionSeconds,
    /// inactive partitions, old dead letters). One broker at a time runs them. 0: none.
    #[arg(long, env = "RETENTION_INTERVAL", default_value_t = RetentionSettings::default().interval_ms)]
    pub retention_interval: u64,
    /// Partitions per retention statement.
    #[arg(long, env = "RETENTION_BATCH_SIZE", default_value_t = RetentionSettings::default().batch_size)]
    pub retention_batch_size: u32,
    /// Days an empty partition may go without a push before it is deleted. 0: never.
    #[arg(long, env = "PARTITION_CLEANUP_DAYS", default_value_t = RetentionSettings::default().partition_cleanup_days)]
    pub partition_cleanup_days: u32,
    /// Milliseconds between eviction passes (maxWaitTimeSeconds). 0: none.
    #[arg(long, env = "EVICTION_INTERVAL", default_value_t = RetentionSettings::default().eviction_interval_ms)]
    pub eviction_interval: u64,
    /// Partitions per eviction statement.
    #[arg(long, env = "EVICTION_BATCH_SIZE", default_value_t = RetentionSettings::default().eviction_batch_size)]
    pub eviction_batch_size: u32,
    /// Seconds a dead letter is kept. 0: until its queue's retention removes its message.
    #[arg(long, env = "DEAD_LETTER_RETENTION_SECONDS", default_value_t = RetentionSettings::default().dead_letter_retention_secs)]
    pub dead_letter_retention_seconds: u64,
    /// Milliseconds between the broker's samples (counters, lag, CPU, RSS) that the status and
    /// analytics routes and the dashboard chart. 0: none.
    #[arg(long, env = "METRICS_SAMPLE_INTERVAL", default_value_t = 60_000)]
    pub metrics_sample_interval: u64,
    /// Per-partition lag series at most in /metrics/prometheus (a cardinality cap; the rest
    /// are counted in queen_partition_series_omitted). Queue and group series are not capped.
    #[arg(long, env = "METRICS_PARTITION_SERIES", default_value_t = 1000)]
    pub metrics_partition_series: usize,
    /// JWT authentication of every route but JWT_SKIP_PATHS.
    #[arg(long, env = "JWT_ENABLED", default_value = "false",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set)]
    pub jwt_enabled: bool,
    /// HS256, RS256, EdDSA, or auto (the token's own, among those with a configured key).
    #[arg(long, env = "JWT_ALGORITHM", default_value = "HS256")]
    pub jwt_algorithm: JwtAlgorithm,
    /// HS256 shared secret.
    #[arg(long, env = "JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// RS256 or EdDSA public key (PEM).
    #[arg(long, env = "JWT_PUBLIC_KEY", hide_env_values = true)]
    pub jwt_public_key: Option<String>,
    /// JWKS endpoint (RS256 and EdDSA keys by kid; fetched again for an unknown kid).
    #[arg(long, env = "JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,
    /// Seconds between JWKS refreshes.
    #[arg(long, env = "JWT_JWKS_REFRESH_INTERVAL", default_value_t = auth::DEFAULT_JWKS_REFRESH_SECS)]
    pub jwt_jwks_refresh_interval: u64,
    /// Required `iss` claim.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Required `aud` claim.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Seconds of tolerance on exp and nbf.
    #[arg(long, env = "JWT_CLOCK_SKEW", default_value_t = auth::DEFAULT_CLOCK_SKEW_SECS)]
    pub jwt_clock_skew: u64,
    /// Comma-separated paths served without a token.
    #[arg(long, env = "JWT_SKIP_PATHS", default_value = auth::DEFAULT_SKIP_PATHS)]
    pub jwt_skip_paths: String,
    /// Claim holding one role.
    #[arg(long, env = "JWT_ROLES_CLAIM", default_value = auth::DEFAULT_ROLES_CLAIM)]
    pub jwt_roles_claim: String,
    /// Claim holding an array of roles.
    #[arg(long, env = "JWT_ROLES_ARRAY_CLAIM", default_value = auth::DEFAULT_ROLES_ARRAY_CLAIM)]
    pub jwt_roles_array_claim: String,
    /// Role name of the admin level.
    #[arg(long, env = "JWT_ROLE_ADMIN", default_value = auth::DEFAULT_ROLE_ADMIN)]
    pub jwt_role_admin: String,
    /// Role name of the read-write level.
    #[arg(long, env = "JWT_ROLE_READ_WRITE", default_value = auth::DEFAULT_ROLE_READ_WRITE)]
    pub jwt_role_read_write: String,
    /// Role name of the read-only level.
    #[arg(long, env = "JWT_ROLE_READ_ONLY", default_value = auth::DEFAULT_ROLE_READ_ONLY)]
    pub jwt_role_read_only: String,
    /// Payload key for queues with encryptionEnabled: 64 hex characters (AES-256-GCM).
    #[arg(long, env = "QUEEN_ENCRYPTION_KEY", hide_env_values = true)]
    pub queen_encryption_key: Option<String>,
}

impl Settings {
    /// Reads the flags and the environment; exits with clap's message on a bad value, and on
    /// --help or --version. Call before any other thread starts (it edits the environment).
    pub fn from_args_and_env() -> Self {
        // An empty variable means unset, as deployment files often write `PORT=`; clap would
        // read it as an empty value.
        for arg in Self::command().get_arguments() {
            if let Some(name) = arg.get_env() {
                if std::env::var_os(name).is_some_and(|v| v.is_empty()) {
                    std::env::remove_var(name);
                }
            }
        }
        Self::parse()
    }

    /// The JWT authenticator, when `JWT_ENABLED` (clones the settings: it runs once, at start).
    fn authenticator(&self) -> Result<Option<Arc<Authenticator>>, String> {
        if !self.jwt_enabled {
            return Ok(None);
        }
        Ok(Some(Arc::new(Authenticator::new(AuthSettings {
            algorithm: self.jwt_algorithm,
            secret: self.jwt_secret.clone(),
            public_key_pem: self.jwt_public_key.clone(),
            jwks_url: self.jwt_jwks_url.clone(),
            jwks_refresh: std::time::Duration::from_secs(self.jwt_jwks_refresh_interval.max(1)),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            clock_skew_secs: self.jwt_clock_skew,
            skip_paths: self
                .jwt_skip_paths
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
            roles_claim: self.jwt_roles_claim.clone(),
            roles_array_claim: self.jwt_roles_array_claim.clone(),
            role_admin: self.jwt_role_admin.clone(),
            role_read_write: self.jwt_role_read_write.clone(),
            role_read_only: self.jwt_role_read_only.clone(),
        })?)))
    }

    /// The broker's configuration and, when a database is configured, PostgreSQL's.
    pub fn into_configs(self) -> Result<(ServerConfig, Option<PgConfig>), String> {
        let auth = self.authenticator()?;
        let backoff = WaitBackoff {
            initial_ms: self.pop_wait_initial_interval_ms,
            threshold: self.pop_wait_backoff_threshold,
            multiplier: self.pop_wait_backoff_multiplier,
            max_ms: self.pop_wait_max_interval_ms,
        };
        if backoff.initial_ms == 0
            || backoff.max_ms == 0
            || !(backoff.multiplier.is_finite() && backoff.multiplier > 0.0)
        {
            return Err("POP_WAIT_* intervals must be positive".into());
        }
        let pg = PgConfig::from_settings(PgSettings {
            url: self.database_url,
            host: self.pg_host,
            port: self.pg_port,
            user: self.pg_user,
            password: self.pg_password,
            db: self.pg_db,
            pool_size: self.db_pool_size,
            use_ssl: self.pg_use_ssl,
            ssl_reject_unauthorized: self.pg_ssl_reject_unauthorized,
            ssl_root_cert: self.pg_ssl_root_cert,
        })?;
        renamed_limiter_setting(|name| std::env::var_os(name).is_some())?;
        if self.limiter_min > self.limiter_max {
            return Err("QUEEN_LIMITER_MIN must not exceed QUEEN_LIMITER_MAX".into());
        }
        let shortest_idle = crate::peers::PEER_IDLE_REUSE.as_millis() as u64 * 2;
        if self.client_idle_timeout_ms != 0 && self.client_idle_timeout_ms < shortest_idle {
            // Brokers reuse a connection to a peer for up to PEER_IDLE_REUSE, as clients do
            // theirs (httpx 5 s): a shorter timeout would close connections they are reusing.
            return Err(format!(
                "CLIENT_IDLE_TIMEOUT_MS must be 0 (no timeout) or at least {shortest_idle}"
            ));
        }
        if self.retention_batch_size == 0 || self.eviction_batch_size == 0 {
            return Err("RETENTION_BATCH_SIZE and EVICTION_BATCH_SIZE must be positive".into());
        }
        let cipher = self
            .queen_encryption_key
            .as_deref()
            .map(PayloadCipher::from_hex)
            .transpose()?
            .map(Arc::new);
        let server = ServerConfig {
            auth,
            cipher,
            sample_interval_ms: self.metrics_sample_interval,
            metrics_partition_series: self.metrics_partition_series,
            pg_warm_interval_ms: self.pg_warm_interval_ms,
            pg_stats_interval_ms: self.pg_stats_interval_ms,
            pop_rounds: self.pop_rounds,
            push_rounds: self.push_rounds,
            admin_inline_partitions: self.admin_inline_partitions,
            admin_deepest_partitions: self.admin_deepest_partitions,
            admin_totals_wait_ms: self.admin_totals_wait_ms,
            ephemeral_max_bytes: self.ephemeral_max_bytes,
            // Peers share ephemeral queues only through PostgreSQL; the embedded mode has none.
            peer_address: pg.is_some().then(|| {
                self.peer_address
                    .clone()
                    .unwrap_or_else(|| format!("127.0.0.1:{}", self.port))
            }),
            retention: RetentionSettings {
                interval_ms: self.retention_interval,
                batch_size: self.retention_batch_size,
                partition_cleanup_days: self.partition_cleanup_days,
                eviction_interval_ms: self.eviction_interval,
                eviction_batch_size: self.eviction_batch_size,
                dead_letter_retention_secs: self.dead_letter_retention_seconds,
                ..RetentionSettings::default()
            },
            host: self.host,
            port: self.port,
            default_timeout_ms: self.default_timeout,
            backoff,
            hotlist: self.hotlist,
            limiter: LimiterConfig {
                initial_limit: self.limiter_initial,
                min_limit: self.limiter_min,
                max_limit: self.limiter_max,
                ..LimiterConfig::default()
            },
            max_body_bytes: self.max_body_bytes,
            client_idle_timeout_ms: self.client_idle_timeout_ms,
            storage_deadline_ms: DEFAULT_STORAGE_DEADLINE_MS,
            kv_limits: queen_core::kv::KvLimits {
                max_ops: self.kv_max_operations,
                max_key_bytes: self.kv_max_key_bytes,
                max_value_bytes: self.kv_max_value_bytes,
                ..queen_core::kv::KvLimits::default()
            },
            file_buffer: match self.file_buffer_dir {
                None => None,
                Some(dir) => {
                    Some(Arc::new(FileBuffer::open(&dir).map_err(|e| {
                        format!("FILE_BUFFER_DIR {}: {e}", dir.display())
                    })?))
                }
            },
        };
        Ok((server, pg))
    }
}

/// The retention worker's settings (`tasks::retention`): Queen's settings, with its defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    /// RETENTION_INTERVAL: milliseconds between retention passes (0: no retention worker).
    pub interval_ms: u64,
    /// RETENTION_BATCH_SIZE: partitions per retention statement.
    pub batch_size: u32,
    /// PARTITION_CLEANUP_DAYS: an empty partition with no push for this long is deleted (0: never).
    pub partition_cleanup_days: u32,
    /// EVICTION_INTERVAL: milliseconds between eviction passes (maxWaitTimeSeconds; 0: none).
    pub eviction_interval_ms: u64,
    /// EVICTION_BATCH_SIZE: partitions per eviction statement.
    pub eviction_batch_size: u32,
    /// DEAD_LETTER_RETENTION_SECONDS: dead letters older than this are deleted (0: kept until
    /// their queue's retention removes their message).
    pub dead_letter_retention_secs: u64,
    /// How long a claimed maintenance lease lasts: renewed before every batch, so only a broker
    /// that died (or lost its database) lets it run out, and the others wait this long.
    pub lease_secs: u32,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            interval_ms: 300_000,
            // About 20 ms of partition locks per statement (docs/benchmarks.md).
            batch_size: 500,
            partition_cleanup_days: 30,
            eviction_interval_ms: 60_000,
            eviction_batch_size: 1000,
            dead_letter_retention_secs: 0,
            lease_secs: 30,
        }
    }
}

impl RetentionSettings {
    /// No worker at all.
    pub const OFF: RetentionSettings = RetentionSettings {
        interval_ms: 0,
        batch_size: 500,
        partition_cleanup_days: 0,
        eviction_interval_ms: 0,
        eviction_batch_size: 1000,
        dead_letter_retention_secs: 0,
        lease_secs: 30,
    };

    pub fn enabled(&self) -> bool {
        self.interval_ms > 0 || self.eviction_interval_ms > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServerConfig, String> {
        Settings::try_parse_from(std::iter::once("queen").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?
            .into_configs()
            .map(|(server, _)| server)
    }

    #[test]
    fn a_client_idle_timeout_below_what_peers_reuse_is_refused() {
        let e = parse(&["--client-idle-timeout-ms", "2000"]).unwrap_err();
        assert!(e.contains("CLIENT_IDLE_TIMEOUT_MS"), "{e}");
        for fine in ["0", "10000", "120000"] {
            let c = parse(&["--client-idle-timeout-ms", fine]).unwrap();
            assert_eq!(c.client_idle_timeout_ms.to_string(), fine);
        }
    }

    #[test]
    fn defaults_and_overrides() {
        // (The test environment may set any of the variables; each case names its own flags.)
        let c = parse(&[
            "--port",
            "7000",
            "--hotlist",
            "0",
            "--pop-wait-max-interval-ms",
            "500",
        ])
        .unwrap();
        assert_eq!((c.port, c.hotlist, c.backoff.max_ms), (7000, false, 500));
        let c = parse(&["--hotlist", "on", "--default-timeout", "30000"]).unwrap();
        assert_eq!((c.hotlist, c.default_timeout_ms), (true, 30_000));
        assert!(parse(&["--port", "x"]).is_err());
        assert!(parse(&["--hotlist", "maybe"]).is_err());
        assert!(parse(&["--pop-wait-initial-interval-ms", "0"]).is_err());
        let c = parse(&["--limiter-min", "8", "--limiter-max", "64"]).unwrap();
        assert_eq!((c.limiter.min_limit, c.limiter.max_limit), (8, 64));
        assert!(parse(&["--limiter-min", "9", "--limiter-max", "8"]).is_err());
    }

    #[test]
    fn a_vegas_setting_stops_the_broker_with_the_new_names() {
        let e = renamed_limiter_setting(|name| name == "QUEEN_VEGAS_MAX").unwrap_err();
        assert!(
            e.contains("QUEEN_VEGAS_MAX") && e.contains("QUEEN_LIMITER_MAX"),
            "{e}"
        );
        assert!(renamed_limiter_setting(|_| false).is_ok());
    }

    #[test]
    fn help_is_generated_from_the_settings() {
        let help = Settings::command().render_long_help().to_string();
        for var in [
            "DATABASE_URL",
            "PORT",
            "QUEEN_HOTLIST",
            "POP_WAIT_MAX_INTERVAL_MS",
            "MAX_BODY_BYTES",
            "CLIENT_IDLE_TIMEOUT_MS",
            "KV_MAX_OPERATIONS",
            "RETENTION_INTERVAL",
            "PARTITION_CLEANUP_DAYS",
            "EVICTION_BATCH_SIZE",
            "JWT_ENABLED",
            "JWT_SKIP_PATHS",
            "QUEEN_ENCRYPTION_KEY",
            "PG_USE_SSL",
            "PG_WARM_INTERVAL_MS",
            "PG_STATS_INTERVAL_MS",
            "POP_ROUNDS",
            "QUEEN_LIMITER_MAX",
        ] {
            assert!(help.contains(var), "--help does not name {var}");
        }
    }
}
