//! Scenario 11: push and leased consume with JWT auth on (HS256, every request carrying a
//! read-write token), each against the same load on a broker with auth off, in the same run on
//! the same database. A broker verifies a token's signature once and then finds it in its cache
//! of verified tokens (by SHA-256 digest), so auth should cost a digest per request.

use std::sync::Arc;

use queen_server::auth::{AuthSettings, Authenticator, JwtAlgorithm};
use queen_server::config::ServerConfig;

use crate::util::Row;

const SECRET: &str = "queen-bench-auth-scenario-secret";

fn token() -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": "bench", "role": "read-write", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("token")
}

pub async fn auth_scenario(
    pg: &queen_storage_pg::PgStorage,
    secs: u64,
    consume_total: usize,
) -> Vec<Row> {
    let (open_app, open) = crate::start_with(pg, ServerConfig::default(), 31).await;
    let secured_config = ServerConfig {
        auth: Some(Arc::new(
            Authenticator::new(AuthSettings {
                secret: Some(SECRET.into()),
                ..AuthSettings::new(JwtAlgorithm::Hs256)
            })
            .expect("auth settings"),
        )),
        ..ServerConfig::default()
    };
    let (secured_app, secured) = crate::start_with(pg, secured_config, 32).await;
    let t = token();
    let push_off = crate::push::json_push_rate(open, 100, secs, None).await;
    let push_on = crate::push::json_push_rate(secured, 100, secs, Some(t.clone())).await;
    let (partitions, consumers) = (10, 4);
    let consume = |app, addr, tag: &'static str, token: Option<String>| async move {
        crate::consume::broker_rate(
            app,
            addr,
            &format!("auth-consume-{tag}"),
            partitions,
            consumers,
            false,
            consume_total,
            token,
        )
        .await
    };
    let consume_off = consume(&open_app, open, "off", None).await;
    let consume_on = consume(&secured_app, secured, "on", Some(t)).await;
    for app in [&open_app, &secured_app] {
        app.shutting_down.send_replace(true);
    }
    vec![
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
