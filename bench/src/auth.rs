//! Scenario 11: push and leased consume with JWT auth on (HS256, every request carrying a
//! read-write token), each against the same load on a broker with auth off, in the same run on
//! the same database, alternating (off, on, on, off; the mean of each side). A broker verifies a token's signature once and then finds it in its cache
//! of verified tokens (by SHA-256 digest), so auth should cost a digest per request.

use std::sync::Arc;

use queen_server::config::ServerConfig;
use queen_server::http::auth::{AuthSettings, Authenticator, JwtAlgorithm};

use crate::util::{Endpoint, Row};

const SECRET: &str = "queen-bench-auth-scenario-secret";

fn token() -> String {
    token_for("bench")
}

fn token_for(sub: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": sub, "role": "read-write", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("token")
}

/// What a request pays for its token in the broker: microseconds per check of one token seen
/// before (the cache), and of tokens never seen (a signature check each).
async fn token_check_cost() -> (f64, f64) {
    let auth = Authenticator::new(AuthSettings {
        secret: Some(SECRET.into()),
        ..AuthSettings::new(JwtAlgorithm::Hs256)
    })
    .expect("auth settings");
    let same = token();
    auth.verify(&same).await.expect("a valid token");
    const N: u32 = 20_000;
    let start = std::time::Instant::now();
    for _ in 0..N {
        auth.verify(&same).await.expect("a valid token");
    }
    let cached = start.elapsed().as_secs_f64() * 1e6 / f64::from(N);
    let fresh: Vec<String> = (0..2_000).map(|i| token_for(&format!("svc-{i}"))).collect();
    let start = std::time::Instant::now();
    for t in &fresh {
        auth.verify(t).await.expect("a valid token");
    }
    let signature = start.elapsed().as_secs_f64() * 1e6 / fresh.len() as f64;
    (cached, signature)
}

pub async fn auth_scenario(
    pg: &queen_storage_pg::PgStorage,
    secs: u64,
    consume_total: usize,
) -> Vec<Row> {
    let (open_app, open) = crate::start_with(pg, crate::bench_config(), 31).await;
    let secured_config = ServerConfig {
        auth: Some(Arc::new(
            Authenticator::new(AuthSettings {
                secret: Some(SECRET.into()),
                ..AuthSettings::new(JwtAlgorithm::Hs256)
            })
            .expect("auth settings"),
        )),
        ..crate::bench_config()
    };
    let (secured_app, secured) = crate::start_with(pg, secured_config, 32).await;
    let t = token();
    // A discarded warm-up (the first push round ran at 0.78x of the later ones, whichever
    // broker it was), then off, on, on, off: each side's mean cancels a linear drift (the
    // consume rounds slow as the tables grow).
    crate::push::json_push_rate(open, 100, secs, None).await;
    let (mut push_off, mut push_on) = (0.0, 0.0);
    for on in [false, true, true, false] {
        let rate = if on {
            crate::push::json_push_rate(secured, 100, secs, Some(t.clone())).await
        } else {
            crate::push::json_push_rate(open, 100, secs, None).await
        };
        eprintln!(
            "auth push round, auth {}: {rate:.0} msg/s",
            if on { "on" } else { "off" }
        );
        *if on { &mut push_on } else { &mut push_off } += rate / 2.0;
    }
    let (partitions, consumers) = (10, 4);
    let (mut consume_off, mut consume_on) = (0.0, 0.0);
    for (round, on) in [false, true, true, false].into_iter().enumerate() {
        let (app, broker) = if on {
            let token = Some(t.clone());
            (
                &secured_app,
                Endpoint {
                    addr: secured,
                    token,
                },
            )
        } else {
            (&open_app, Endpoint::open(open))
        };
        let rate = crate::consume::broker_rate(
            app,
            &broker,
            &format!("auth-consume-{round}"),
            partitions,
            consumers,
            crate::consume::Consume::Leased,
            consume_total,
        )
        .await;
        eprintln!(
            "auth consume round, auth {}: {rate:.0} msg/s",
            if on { "on" } else { "off" }
        );
        *if on {
            &mut consume_on
        } else {
            &mut consume_off
        } += rate / 2.0;
    }
    for app in [&open_app, &secured_app] {
        app.shutting_down.send_replace(true);
    }
    let (cached_us, signature_us) = token_check_cost().await;
    vec![
        Row::new(
            "token check with JWT auth, cached (SHA-256 of the token, one lookup)",
            "us per request",
            cached_us,
            "-",
            f64::NAN,
        ),
        Row::new(
            "token check with JWT auth, signature (HS256, a token not seen before)",
            "us per request",
            signature_us,
            "-",
            f64::NAN,
        ),
        Row::new(
            "push with JWT auth, batch 100, 8 producers, 10 partitions",
            "msg/s",
            push_on,
            "auth off",
            push_off,
        ),
        Row::new(
            format!("consume leased with JWT auth, batch 100, {partitions} partitions, {consumers} consumers"),
            "msg/s",
            consume_on,
            "auth off",
            consume_off,
        ),
    ]
}
