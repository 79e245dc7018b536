//! Settings a database or role may give every session (`ALTER DATABASE .. SET`, as DBAs do) that
//! the broker's own sessions must not inherit: a default isolation above READ COMMITTED, a
//! `statement_timeout` shorter than a migration or an admin pass, an `idle_session_timeout` that
//! closes the connection listening for events. And a PgBouncer (session pooling) between the
//! broker and its database, which refuses the `options` startup parameter.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use queen_core::events::DeliveryEvent;
use queen_core::storage::{InspectStorage, MessageStorage, PushOutcome};
use queen_storage_pg::{statistics_pass, testing, PgConfig, PgStorage, MIGRATION_LOCK};

/// A fresh database whose sessions get `settings` (each `name = 'value'`), and the broker's
/// storage on it, connected (and migrated) after they were set.
async fn database_setting(name: &str, settings: &[&str]) -> PgStorage {
    let cfg = testing::fresh_database_config(name).await;
    set_for_database(name, settings).await;
    connect(cfg).await
}

async fn set_for_database(name: &str, settings: &[&str]) {
    let (admin, conn) = testing::fresh_database_config_existing(name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    let driver = tokio::spawn(conn);
    for s in settings {
        admin
            .batch_execute(&format!("ALTER DATABASE {name} SET {s}"))
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    drop(admin);
    let _ = driver.await;
}

async fn connect(cfg: tokio_postgres::Config) -> PgStorage {
    PgStorage::connect(&PgConfig {
        tls: Default::default(),
        pg: cfg,
        pool_size: 16,
    })
    .await
    .unwrap_or_else(|e| panic!("connecting and migrating: {e}"))
}

/// A pooled connection's transaction_isolation, lock_timeout and client_min_messages.
async fn session_settings(pg: &PgStorage) -> Vec<String> {
    let client = pg.pool().get().await.expect("connection");
    let mut settings = vec![];
    for name in [
        "transaction_isolation",
        "lock_timeout",
        "client_min_messages",
    ] {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .expect("show");
        settings.push(row.get(0));
    }
    settings
}

/// The broker's event listener on `pg`, once it listens (its first event is a `Resync`).
async fn listening(
    pg: &PgStorage,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<DeliveryEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(pg.listen_events(tx));
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the listener connects");
    assert_eq!(first, Some(DeliveryEvent::Resync));
    (listener, rx)
}

/// Whether a push to `queue` is heard within 5 s, with no reconnection's `Resync` before it (the
/// queue's creation, `QueueChanged`, may come first).
async fn pushed_event_arrives(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<DeliveryEvent>,
    queue: &str,
) -> bool {
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(event) = rx.recv().await {
            match event {
                DeliveryEvent::Resync => return false,
                DeliveryEvent::Pushed { queue: ref q, .. } if q == queue => return true,
                _ => {}
            }
        }
        false
    })
    .await;
    heard == Ok(true)
}

/// A database whose sessions default to SERIALIZABLE: the broker's run at READ COMMITTED, so
/// eight producers of one partition all land (at SERIALIZABLE they failed with 40001: 503s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serializable_default_does_not_reach_the_brokers_transactions() {
    let name = format!("queen_sess_iso_{}", std::process::id());
    let pg = Arc::new(
        database_setting(&name, &["default_transaction_isolation = 'serializable'"]).await,
    );
    // The pool's one connection so far ran the migrations: they put its settings back.
    assert_eq!(
        session_settings(&pg).await,
        ["read committed", "10s", "notice"],
        "isolation, the broker's own lock timeout, the database's client_min_messages"
    );

    let mut producers = vec![];
    for p in 0..8u128 {
        let pg = pg.clone();
        producers.push(tokio::spawn(async move {
            for k in 0..25u128 {
                let outcome = pg
                    .push(vec![testing::one_message("iso", "p", p * 1_000 + k + 1)])
                    .await
                    .expect("push")
                    .remove(0)
                    .remove(0);
                assert!(matches!(outcome, PushOutcome::Queued { .. }), "{outcome:?}");
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let mut offsets = vec![];
    pg.each_partition_of("iso", &mut |v| offsets.push(v.last_offset))
        .await
        .expect("the queue's partitions");
    assert_eq!(offsets, vec![199]);
    drop(pg);
    testing::drop_database(&name).await;
}

/// A database whose statement_timeout is far shorter than a migration's wait and than an admin
/// pass over 50,000 partitions: a broker that waits 1 s for another's migrations (200 ms
/// timeout) starts, and the pass (20 ms timeout) runs to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_statement_timeout_cancels_neither_migrations_nor_a_pass() {
    let name = format!("queen_sess_timeout_{}", std::process::id());
    let cfg = testing::fresh_database_config(&name).await;
    set_for_database(&name, &["statement_timeout = '200ms'"]).await;
    let (other, conn) = testing::fresh_database_config_existing(&name)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("another broker's session");
    let driver = tokio::spawn(conn);
    other
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .expect("the migration lock");
    let starting = tokio::spawn(connect(cfg.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!starting.is_finished(), "migrated under another's lock");
    other
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .expect("unlock");
    drop(other);
    let _ = driver.await;
    let pg = starting.await.expect("the broker's start");

    pg.push(vec![testing::one_message("big", "p0", 1)])
        .await
        .expect("push");
    let client = pg.pool().get().await.expect("connection");
    client
        .batch_execute(
            "SET statement_timeout = 0;
             INSERT INTO queen.log_partitions (id, queue_id, name, last_write_at)
             SELECT gen_random_uuid(), q.id, 'p' || g, now()
               FROM queen.queues q, generate_series(1, 50000) g
              WHERE q.name = 'big';
             RESET statement_timeout",
        )
        .await
        .expect("partitions");
    drop(client);
    drop(pg);
    set_for_database(&name, &["statement_timeout = '20ms'"]).await;
    let pg = connect(cfg).await;
    let mut seen = 0u64;
    let counted = pg
        .each_partition_of("big", &mut |_| seen += 1)
        .await
        .expect("a pass over the big queue");
    assert_eq!((counted, seen), (50_001, 50_001));
    // The statistics pass's ANALYZE of the tables that grew runs to the end as well.
    statistics_pass(&pg).await.expect("the statistics pass");
    drop(pg);
    testing::drop_database(&name).await;
}

/// A database whose idle_session_timeout (300 ms) would close the event connection while it waits
/// (and lose every notification until the reconnect): it stays open, and events arrive on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_connection_outlives_an_idle_session_timeout() {
    let name = format!("queen_sess_idle_{}", std::process::id());
    let pg = database_setting(&name, &["idle_session_timeout = '300ms'"]).await;
    let (listener, mut rx) = listening(&pg).await;
    // Six timeouts' worth of idling: a closed connection reconnects after a second and resyncs.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert!(
        rx.try_recv().is_err(),
        "the event connection was closed and opened again while idle"
    );
    pg.push(vec![testing::one_message("idle", "p", 1)])
        .await
        .expect("push");
    assert!(
        pushed_event_arrives(&mut rx, "idle").await,
        "the push's event arrives on the connection, and it was not opened again"
    );
    listener.abort();
    drop(pg);
    testing::drop_database(&name).await;
}

/// A PgBouncer in session mode on a free port in front of DATABASE_URL's server; stopped on drop.
struct Bouncer {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Bouncer {
    fn start() -> Bouncer {
        // The test command installs it (Debian's package) and says where.
        let bin = std::env::var("QUEEN_PGBOUNCER").unwrap_or_else(|_| "/usr/sbin/pgbouncer".into());
        assert!(
            std::path::Path::new(&bin).exists(),
            "PgBouncer is not at {bin}: run the test command (`bash .ci/test`), which installs it"
        );
        let base = tokio_postgres::Config::from_str(&testing::database_url()).expect("URL");
        let server_port = base.get_ports().first().copied().unwrap_or(5432);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("queen-bouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("its folder");
        let user = base.get_user().unwrap_or("postgres").to_string();
        // Trust still asks that the user be known: the users file names it.
        let users = dir.join("users.txt");
        std::fs::write(&users, format!("\"{user}\" \"\"\n")).expect("its users");
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={server_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {}\npool_mode = session\n\
                 max_client_conn = 100\ndefault_pool_size = 40\n",
                users.display()
            ),
        )
        .expect("its configuration");
        // PgBouncer will not run as root; it drops to the user that owns the test database.
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false);
        let mut cmd = std::process::Command::new(&bin);
        if root {
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(&ini)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("PgBouncer starts");
        Bouncer { child, port, dir }
    }

    fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let base = tokio_postgres::Config::from_str(&testing::database_url()).expect("URL");
        let mut cfg = tokio_postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port)
            .user(base.get_user().unwrap_or("postgres"))
            .dbname(dbname);
        cfg
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Through PgBouncer (session pooling): the broker connects (before, PgBouncer refused the
/// `options` startup parameter and the broker waited for ever), migrates, runs at its isolation
/// and lock timeout, pushes, and hears the push on its event connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_runs_through_pgbouncer_in_session_mode() {
    let name = format!("queen_sess_bouncer_{}", std::process::id());
    testing::fresh_database_config(&name).await;
    set_for_database(&name, &["default_transaction_isolation = 'serializable'"]).await;
    let bouncer = Bouncer::start();
    let pg = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let attempt = PgStorage::connect(&PgConfig {
                tls: Default::default(),
                pg: bouncer.config(&name),
                pool_size: 4,
            })
            .await;
            match attempt {
                Ok(pg) => return pg,
                // PgBouncer is still starting: its port refuses.
                Err(queen_core::storage::StorageError::Unavailable(_)) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("through PgBouncer: {e}"),
            }
        }
    })
    .await
    .expect("the broker connects through PgBouncer");
    assert_eq!(
        session_settings(&pg).await[..2],
        ["read committed", "10s"],
        "isolation and the broker's own lock timeout, through PgBouncer"
    );

    let (listener, mut rx) = listening(&pg).await;
    pg.push(vec![testing::one_message("bounced", "p", 1)])
        .await
        .expect("push");
    assert!(
        pushed_event_arrives(&mut rx, "bounced").await,
        "the push's event arrives through PgBouncer"
    );
    listener.abort();
    drop(pg);
    drop(bouncer);
    testing::drop_database(&name).await;
}
