//! The `queen` binary: configuration, storage, listener, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use queen_core::storage::{StorageError, StorageSet};
use queen_server::broker::Broker;
use queen_server::config::Settings;
use queen_server::wall_now;
use queen_storage_pg::PgStorage;
use queen_storage_sim::{SimBugs, SimDb};
use tokio::net::TcpListener;

// Why mimalloc: see server/Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `info`, but the connection pool's own warnings only from `error` up: it warns once per closed
/// connection (11,349 lines in two 3 s outages behind PgBouncer, which accepts each new
/// connection and then fails its first statement), where the broker reports storage trouble
/// itself (one warning per route and SQLSTATE every 10 s, and `queen_storage_errors_total`).
const DEFAULT_LOG_FILTER: &str = "info,deadpool.postgres=error";

fn main() {
    // Flags and environment variables; --help and --version exit here.
    let settings = Settings::from_args_and_env();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .init();
    raise_open_files_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(settings)) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}

/// Every parked long-poll holds a connection, and so a descriptor: the soft limit many hosts start
/// a service with (1,024 under systemd) would refuse connections past about a thousand parked
/// consumers. The soft limit is raised to the hard one, as Go's runtime does for its programs;
/// the hard limit stays the operator's (`LimitNOFILE=`, `ulimit -Hn`).
fn raise_open_files_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open files"),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot raise the open files limit: connections past it are refused"
        ),
    }
}

async fn run(settings: Settings) -> Result<(), String> {
    let (config, pg_config) = settings.into_configs()?;
    let seed =
        u64::try_from(wall_now().0).unwrap_or(0) ^ u64::from(std::process::id()).rotate_left(32);
    let (storage, pg) = match pg_config {
        Some(pg) => {
            let Some(storage) = connect_when_up(&pg).await? else {
                return Ok(());
            };
            tracing::info!(
                pool = pg.pool_size,
                sslmode = ?pg.tls.mode,
                "storage: PostgreSQL (schema queen, migrations applied)"
            );
            (StorageSet::of(Arc::new(storage.clone())), Some(storage))
        }
        None => {
            tracing::warn!("storage: in-memory backend (no DATABASE_URL or PG_* set): nothing survives a restart");
            let db = SimDb::new(seed, Arc::new(wall_now), SimBugs::default());
            (StorageSet::of(db), None)
        }
    };
    queen_server::sealing::check_cluster_key(&*storage.admin, config.cipher.as_deref()).await?;
    if config.auth.is_some() {
        tracing::info!("JWT authentication on");
    }
    let addr = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    tracing::info!(%addr, hotlist = config.hotlist, "queen listening");
    let warm_interval = config.pg_warm_interval_ms;
    let stats_interval = config.pg_stats_interval_ms;
    let broker = Broker::new(config, storage, seed);
    queen_server::tasks::start(&broker);
    if let Some(pg) = &pg {
        queen_server::spawn_event_listener(broker.clone(), pg);
        queen_server::spawn_clock_alignment(&broker, pg);
        queen_server::spawn_snapshot_watch(&broker, pg);
        if warm_interval > 0 {
            tokio::spawn(
                queen_storage_pg::ConnectionWarmer::default()
                    .run(pg.clone(), Duration::from_millis(warm_interval)),
            );
        }
        if stats_interval > 0 {
            tokio::spawn(queen_storage_pg::keep_statistics(
                pg.clone(),
                Duration::from_millis(stats_interval),
            ));
        }
    }

    let janitor = {
        let broker = broker.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                broker.prune_gates();
            }
        })
    };
    let mut connections = tokio::task::JoinSet::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let broker = broker.clone();
                    connections.spawn(async move {
                        if let Err(e) = queen_server::serve_connection(broker, stream).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                    // Reap finished connection tasks so the set stays small.
                    while connections.try_join_next().is_some() {}
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down: parked pops answer 204, in-flight requests finish");
    broker.shutting_down.send_replace(true);
    drop(listener);
    janitor.abort();
    let drained = async { while connections.join_next().await.is_some() {} };
    tokio::select! {
        _ = drained => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(Duration::from_secs(30)) => tracing::warn!("connections still open after 30 s; exiting"),
    }
    Ok(())
}

/// The first connection to PostgreSQL and its migrations. A database that is not up yet (a host
/// booting both, a restart, a failover) is waited for, asked again at most every
/// `FIRST_CONNECTION_BACKOFF_CAP`, with a warning each time; a wrong setting stops the broker at
/// once and says which. `None`: a shutdown signal came while waiting.
async fn connect_when_up(pg: &queen_storage_pg::PgConfig) -> Result<Option<PgStorage>, String> {
    let mut backoff = Duration::from_millis(250);
    let mut attempt = 1u32;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        match PgStorage::connect(pg).await {
            Ok(storage) => return Ok(Some(storage)),
            Err(StorageError::Unavailable(e)) => {
                tracing::warn!(
                    attempt,
                    retry_in_ms = backoff.as_millis() as u64,
                    error = %e,
                    "waiting for PostgreSQL"
                );
            }
            Err(e) => return Err(format!("cannot use PostgreSQL: {e}")),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = &mut shutdown => return Ok(None),
        }
        backoff = (backoff * 2).min(FIRST_CONNECTION_BACKOFF_CAP);
        attempt = attempt.saturating_add(1);
    }
}

/// The longest wait between two tries of the first connection.
const FIRST_CONNECTION_BACKOFF_CAP: Duration = Duration::from_secs(5);

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
