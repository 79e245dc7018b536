//! JWT authentication over real HTTP: every route at every role (table-driven, both backends),
//! each algorithm (HS256, RS256, EdDSA, auto, a JWKS served by the test and rotated), the tokens
//! that must be refused (alg none, algorithm confusion, expiry beyond the skew, issuer, audience,
//! signature, nbf), and the trusted producer identity on pop, dead letters, transactions, the
//! binary wire and the failover buffer. The keys are test fixtures (tests/fixtures/jwt).

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{start, Client, Response, Store, TestBroker};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use queen_server::config::ServerConfig;
use queen_server::http::auth::{AuthSettings, Authenticator, JwtAlgorithm};
use serde_json::{json, Value};

const SECRET: &str = "a-shared-secret-for-the-auth-tests-0123456789";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str, role: Option<&str>) -> Value {
    let mut c = json!({"sub": sub, "exp": now() + 600, "iat": now()});
    if let Some(r) = role {
        c["role"] = json!(r);
    }
    c
}

fn hs256(claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn rs256(claims: &Value, key: &str, kid: Option<&str>) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = kid.map(str::to_string);
    encode(
        &h,
        claims,
        &EncodingKey::from_rsa_pem(fixture(key).as_bytes()).unwrap(),
    )
    .unwrap()
}

fn eddsa(claims: &Value, kid: Option<&str>) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = kid.map(str::to_string);
    encode(
        &h,
        claims,
        &EncodingKey::from_ed_pem(fixture("ed25519_private.pem").as_bytes()).unwrap(),
    )
    .unwrap()
}

fn hs_settings() -> AuthSettings {
    AuthSettings {
        secret: Some(SECRET.into()),
        ..AuthSettings::new(JwtAlgorithm::Hs256)
    }
}

fn with_auth(settings: AuthSettings) -> ServerConfig {
    ServerConfig {
        auth: Some(Arc::new(
            Authenticator::new(settings).expect("auth settings"),
        )),
        ..ServerConfig::default()
    }
}

async fn send(
    addr: SocketAddr,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Response {
    let mut c = Client::connect(addr).await;
    if let Some(t) = token {
        c = c.with_header("authorization", &format!("Bearer {t}"));
    }
    let body = body.map(|b| serde_json::to_vec(b).unwrap());
    c.send(method, path, body.as_deref()).await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Public,
    /// Any valid token, with a role or not (an unknown route: 404 once authenticated).
    AnyToken,
    ReadOnly,
    ReadWrite,
    Admin,
}

/// Every route the broker serves, with a body it accepts, and the level it requires.
fn routes() -> Vec<(&'static str, &'static str, Option<Value>, Level)> {
    use Level::*;
    let ts = "2026-01-01T00:00:00.000Z";
    vec![
        ("GET", "/", None, Public),
        ("GET", "/health", None, Public),
        ("GET", "/metrics", None, Public),
        ("GET", "/metrics/prometheus", None, Public),
        (
            "POST",
            "/api/v1/configure",
            Some(json!({"queue": "authq"})),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/push",
            Some(json!({"items": [{"queue": "authq", "payload": {"n": 1}}]})),
            ReadWrite,
        ),
        ("GET", "/api/v1/pop/queue/authq?wait=false", None, ReadWrite),
        (
            "GET",
            "/api/v1/pop/queue/authq/partition/Default?wait=false",
            None,
            ReadWrite,
        ),
        (
            "GET",
            "/api/v1/pop?namespace=authq&wait=false",
            None,
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/ack",
            Some(
                json!({"transactionId": "t", "partitionId": "00000000-0000-0000-0000-000000000001", "status": "completed"}),
            ),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/ack/batch",
            Some(
                json!({"acknowledgments": [{"transactionId": "t", "partitionId": "00000000-0000-0000-0000-000000000001", "status": "completed"}]}),
            ),
            ReadWrite,
        ),
        ("POST", "/api/v1/lease/some-lease/extend", None, ReadWrite),
        (
            "POST",
            "/api/v1/transaction",
            Some(
                json!({"operations": [{"type": "push", "items": [{"queue": "authq", "payload": {"t": 1}}]}]}),
            ),
            ReadWrite,
        ),
        ("GET", "/api/v1/dlq?queue=authq", None, ReadOnly),
        ("POST", "/api/v1/dlq/1/requeue", None, ReadWrite),
        (
            "POST",
            "/api/v1/consumer-groups/g/queues/authq/seek",
            Some(json!({"toEnd": true})),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/consumer-groups/g/subscription",
            Some(json!({"subscriptionTimestamp": ts})),
            ReadWrite,
        ),
        (
            "DELETE",
            "/api/v1/consumer-groups/g/queues/authq",
            None,
            Admin,
        ),
        ("DELETE", "/api/v1/consumer-groups/g", None, Admin),
        ("DELETE", "/api/v1/resources/queues/authq-gone", None, Admin),
        ("GET", "/api/v1/system/maintenance", None, Admin),
        (
            "POST",
            "/api/v1/system/maintenance",
            Some(json!({"enabled": false})),
            Admin,
        ),
        ("GET", "/api/v1/system/maintenance/pop", None, Admin),
        (
            "POST",
            "/api/v1/system/maintenance/pop",
            Some(json!({"enabled": false})),
            Admin,
        ),
        ("GET", "/api/v1/resources/overview", None, ReadOnly),
        ("GET", "/api/v1/resources/namespaces", None, ReadOnly),
        ("GET", "/api/v1/resources/tasks", None, ReadOnly),
        ("GET", "/api/v1/resources/queues", None, ReadOnly),
        ("GET", "/api/v1/resources/queues/authq", None, ReadOnly),
        (
            "GET",
            "/api/v1/resources/queues/authq/depth",
            None,
            ReadOnly,
        ),
        ("GET", "/api/v1/resources/partitions", None, ReadOnly),
        ("GET", "/api/v1/messages?queue=authq", None, ReadOnly),
        (
            "GET",
            "/api/v1/messages/00000000-0000-0000-0000-000000000001/t",
            None,
            ReadOnly,
        ),
        (
            "DELETE",
            "/api/v1/messages/00000000-0000-0000-0000-000000000001/t",
            None,
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/messages/00000000-0000-0000-0000-000000000001/t/retry",
            None,
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/traces",
            Some(
                json!({"transactionId": "t", "partitionId": "00000000-0000-0000-0000-000000000001", "data": {"x": 1}}),
            ),
            ReadWrite,
        ),
        ("GET", "/api/v1/traces/names", None, ReadOnly),
        ("GET", "/api/v1/traces/by-name/n", None, ReadOnly),
        (
            "GET",
            "/api/v1/traces/00000000-0000-0000-0000-000000000001/t",
            None,
            ReadOnly,
        ),
        ("GET", "/api/v1/status", None, ReadOnly),
        ("GET", "/api/v1/status/queues", None, ReadOnly),
        ("GET", "/api/v1/status/queues/authq", None, ReadOnly),
        ("GET", "/api/v1/status/analytics", None, ReadOnly),
        ("GET", "/api/v1/analytics/system-metrics", None, ReadOnly),
        ("GET", "/api/v1/analytics/worker-metrics", None, ReadOnly),
        ("GET", "/api/v1/consumer-groups", None, ReadOnly),
        ("GET", "/api/v1/consumer-groups/lagging", None, ReadOnly),
        ("GET", "/api/v1/consumer-groups/g", None, ReadOnly),
        ("POST", "/api/v1/stats/refresh", None, Admin),
        (
            "POST",
            "/api/v1/kv",
            Some(json!({"operations": [{"op": "get", "ns": "authns", "key": "k"}]})),
            ReadWrite,
        ),
        ("GET", "/api/v1/kv/authns/k", None, ReadOnly),
        (
            "PUT",
            "/api/v1/kv/authns/k",
            Some(json!({"v": 1})),
            ReadWrite,
        ),
        ("DELETE", "/api/v1/kv/authns/k", None, ReadWrite),
        (
            "POST",
            "/api/v1/locks",
            Some(json!({"operations": [{"op": "get", "name": "authlock"}]})),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/timers",
            Some(json!({"operations": []})),
            ReadWrite,
        ),
        ("GET", "/api/v1/timers/authq", None, ReadOnly),
        ("GET", "/api/v1/timers/authq/k", None, ReadOnly),
        ("DELETE", "/api/v1/timers/authq/k", None, ReadWrite),
        (
            "POST",
            "/api/v1/fetch",
            Some(json!({"queue": "authq", "partition": "Default", "offset": 0})),
            ReadOnly,
        ),
        (
            "POST",
            "/api/v1/partitions/changed",
            Some(json!({})),
            ReadOnly,
        ),
        ("POST", "/streams/v1/queries", Some(json!({})), ReadWrite),
        ("POST", "/streams/v1/state/get", Some(json!({})), ReadOnly),
        ("POST", "/streams/v1/cycle", Some(json!({})), ReadWrite),
        (
            "GET",
            "/api/v1/ephemeral/pop?queue=authe&wait=false",
            None,
            ReadWrite,
        ),
        ("GET", "/api/v1/ephemeral/queues", None, ReadOnly),
        (
            "GET",
            "/api/v1/ephemeral/queues/authe/depth",
            None,
            ReadOnly,
        ),
        ("DELETE", "/api/v1/ephemeral/queue/authe", None, ReadWrite),
        (
            "POST",
            "/api/v1/ephemeral/configure",
            Some(json!({"queue": "authe"})),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/ephemeral/reset",
            Some(json!({"queue": "authe"})),
            ReadWrite,
        ),
        (
            "POST",
            "/api/v1/ephemeral/push",
            Some(json!({"queue": "authe", "items": [{"payload": {"n": 1}}]})),
            ReadWrite,
        ),
        ("POST", "/api/v1/ephemeral/ack", Some(json!({})), ReadWrite),
        // Not a route: a token is still asked for, and a valid one gets the 404.
        ("GET", "/api/v1/no-such-route", None, AnyToken),
    ]
}

/// The matrix above tries every route of the route table at the level the table states (a
/// public path, served without a token by `JWT_SKIP_PATHS`, is read-only in the table): a new
/// route, or a changed level, fails here until the matrix says it.
#[test]
fn the_matrix_covers_the_route_table() {
    use queen_server::http::auth::Access;
    use queen_server::routes::{find, ROUTES};
    let mut covered = vec![false; ROUTES.len()];
    for (method, path, _, needed) in routes() {
        let path = path.split('?').next().unwrap();
        let seg: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let method = hyper::Method::from_bytes(method.as_bytes()).unwrap();
        let Some((route, _)) = find(&method, &seg) else {
            assert_eq!(needed, Level::AnyToken, "{method} {path} is in no route");
            continue;
        };
        let table = match route.access {
            Access::ReadOnly => Level::ReadOnly,
            Access::ReadWrite => Level::ReadWrite,
            Access::Admin => Level::Admin,
        };
        let expected = if needed == Level::Public {
            Level::ReadOnly
        } else {
            needed
        };
        assert_eq!(table, expected, "{method} {path}: the table's level");
        let i = ROUTES.iter().position(|r| std::ptr::eq(r, route)).unwrap();
        covered[i] = true;
    }
    let missing: Vec<String> = ROUTES
        .iter()
        .zip(&covered)
        .filter(|(_, c)| !**c)
        .map(|(r, _)| format!("{} {}", r.verb.as_str(), r.pattern))
        .collect();
    assert!(
        missing.is_empty(),
        "routes the auth matrix never tries: {missing:?}"
    );
}

async fn every_route_at_every_role(store: Store) {
    let b = start(store, with_auth(hs_settings())).await;
    let tokens: Vec<(&str, Option<String>, Option<Level>)> = vec![
        ("no token", None, None),
        ("no role", Some(hs256(&claims("nobody", None))), None),
        (
            "unknown role",
            Some(hs256(&claims("x", Some("superuser")))),
            None,
        ),
        (
            "read-only",
            Some(hs256(&claims("reader", Some("read-only")))),
            Some(Level::ReadOnly),
        ),
        (
            "read-write",
            Some(hs256(&claims("writer", Some("read-write")))),
            Some(Level::ReadWrite),
        ),
        (
            "admin",
            Some(hs256(&claims("root", Some("admin")))),
            Some(Level::Admin),
        ),
        // The array claim: the highest role counts.
        (
            "roles array",
            Some(hs256(
                &json!({"sub": "svc", "exp": now() + 600, "roles": ["read-only", "admin"]}),
            )),
            Some(Level::Admin),
        ),
    ];
    let mut checked = 0;
    for (method, path, body, needed) in routes() {
        for (who, token, level) in &tokens {
            let r = send(b.addr, token.as_deref(), method, path, body.as_ref()).await;
            let expected = if needed == Level::Public {
                None
            } else if token.is_none() {
                Some((401, "Authentication required"))
            } else if needed != Level::AnyToken && level.is_none_or(|l| l < needed) {
                Some((403, "Insufficient permissions"))
            } else {
                None
            };
            match expected {
                Some((status, error)) => {
                    assert_eq!(
                        r.status,
                        status,
                        "{who} {method} {path}: {:?}",
                        String::from_utf8_lossy(&r.body)
                    );
                    assert_eq!(r.json(), json!({"error": error}), "{who} {method} {path}");
                    if status == 401 {
                        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
                    }
                }
                None => assert!(
                    r.status != 401 && r.status != 403 && r.status < 500,
                    "{who} {method} {path} must pass auth: {} {:?}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, routes().len() * tokens.len());
    // A preflight carries no credentials and is answered.
    assert_eq!(
        send(b.addr, None, "OPTIONS", "/api/v1/push", None)
            .await
            .status,
        204
    );
    // Nothing the refused requests asked for happened: only the admin's deletes and the
    // writers' pushes did (the queue exists, from the allowed pushes).
    let dlq = send(
        b.addr,
        Some(&hs256(&claims("r", Some("read-only")))),
        "GET",
        "/api/v1/dlq?queue=authq",
        None,
    )
    .await;
    assert_eq!(dlq.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_at_every_role_memory() {
    every_route_at_every_role(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_at_every_role_postgres() {
    every_route_at_every_role(Store::Postgres("auth_roles")).await;
}

/// A refused push stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_change_nothing() {
    let b = start(Store::Memory, with_auth(hs_settings())).await;
    let reader = hs256(&claims("reader", Some("read-only")));
    let writer = hs256(&claims("writer", Some("read-write")));
    let push = json!({"items": [{"queue": "still", "payload": {"n": 1}}]});
    assert_eq!(
        send(b.addr, None, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        401
    );
    assert_eq!(
        send(b.addr, Some(&reader), "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        403
    );
    assert_eq!(
        send(
            b.addr,
            Some(&writer),
            "GET",
            "/api/v1/pop/queue/still?wait=false",
            None
        )
        .await
        .status,
        204
    );
    assert_eq!(
        send(
            b.addr,
            Some(&writer),
            "DELETE",
            "/api/v1/resources/queues/still",
            None
        )
        .await
        .status,
        403
    );
    assert_eq!(
        send(b.addr, Some(&writer), "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    assert_eq!(
        send(
            b.addr,
            Some(&writer),
            "DELETE",
            "/api/v1/resources/queues/still",
            None
        )
        .await
        .status,
        403
    );
    let popped = send(
        b.addr,
        Some(&writer),
        "GET",
        "/api/v1/pop/queue/still?wait=false",
        None,
    )
    .await;
    assert_eq!(
        popped.status, 200,
        "the writer's message is there, and the refused delete did nothing"
    );
}

/// Which tokens a broker with `settings` accepts (status of a read-write route).
async fn status_with(b: &TestBroker, token: &str) -> u16 {
    send(
        b.addr,
        Some(token),
        "GET",
        "/api/v1/pop/queue/algq?wait=false",
        None,
    )
    .await
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_algorithm_and_what_it_refuses() {
    let rw = claims("svc", Some("read-write"));
    let rsa_pub = fixture("rsa_public.pem");
    an_hs256_broker_refuses_forged_and_foreign_tokens(&rw).await;
    issuer_and_audience_are_required_when_configured(&rw).await;
    public_key_algorithms_and_auto(&rw, rsa_pub).await;
}

/// A token with `alg: none` and no signature.
fn unsigned_token(claims: &Value) -> String {
    use base64::Engine;
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.",
        e(&json!({"alg": "none", "typ": "JWT"})),
        e(claims)
    )
}

/// An HS256 broker: a good token passes; alg none, another secret, a tampered payload, RS256
/// and EdDSA tokens, garbage are refused; a bare token passes; expiry and not-before hold.
async fn an_hs256_broker_refuses_forged_and_foreign_tokens(rw: &Value) {
    // HS256.
    let hs = start(Store::Memory, with_auth(hs_settings())).await;
    assert_eq!(status_with(&hs, &hs256(rw)).await, 204);
    // alg none: a token with no signature.
    let none = unsigned_token(rw);
    assert_eq!(status_with(&hs, &none).await, 401);
    let r = send(
        hs.addr,
        Some(&none),
        "GET",
        "/api/v1/pop/queue/algq?wait=false",
        None,
    )
    .await;
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("Invalid token"),
        "{:?}",
        r.json()
    );
    // A token signed with another secret; a tampered payload.
    let other = encode(
        &Header::new(Algorithm::HS256),
        rw,
        &EncodingKey::from_secret(b"another secret"),
    )
    .unwrap();
    assert_eq!(status_with(&hs, &other).await, 401);
    let good = hs256(rw);
    let mut parts: Vec<&str> = good.split('.').collect();
    let admin_payload = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(claims("svc", Some("admin")).to_string())
    };
    parts[1] = &admin_payload;
    assert_eq!(
        status_with(&hs, &parts.join(".")).await,
        401,
        "a payload changed after signing"
    );
    // RS256 and EdDSA tokens on an HS256 broker.
    assert_eq!(
        status_with(&hs, &rs256(rw, "rsa_private.pem", None)).await,
        401
    );
    assert_eq!(status_with(&hs, &eddsa(rw, None)).await, 401);
    // Garbage, and the bare token (no Bearer prefix) with a lowercase header.
    assert_eq!(status_with(&hs, "not-a-jwt").await, 401);
    let mut bare = Client::connect(hs.addr)
        .await
        .with_header("authorization", &good);
    assert_eq!(
        bare.get("/api/v1/pop/queue/algq?wait=false").await.status,
        204
    );
    let mut lower = Client::connect(hs.addr)
        .await
        .with_header("Authorization", &format!("bearer {good}"));
    assert_eq!(
        lower.get("/api/v1/pop/queue/algq?wait=false").await.status,
        204
    );

    // Expiry and not-before, with the 30 s skew.
    let at = |exp: i64, nbf: Option<i64>| {
        let mut c = json!({"sub": "svc", "role": "read-write", "exp": now() as i64 + exp});
        if let Some(n) = nbf {
            c["nbf"] = json!(now() as i64 + n);
        }
        hs256(&c)
    };
    assert_eq!(
        status_with(&hs, &at(-10, None)).await,
        204,
        "expired 10 s ago: within the skew"
    );
    assert_eq!(
        status_with(&hs, &at(-120, None)).await,
        401,
        "expired 2 min ago"
    );
    assert_eq!(
        status_with(&hs, &at(600, Some(300))).await,
        401,
        "not valid for 5 more minutes"
    );
    let stale = at(-120, None);
    let expired = send(hs.addr, Some(&stale), "GET", "/api/v1/dlq?queue=q", None).await;
    assert_eq!(expired.json()["error"], "Invalid token: expired");
    assert!(
        !String::from_utf8_lossy(&expired.body).contains(&stale),
        "an error never repeats the token"
    );
}

async fn issuer_and_audience_are_required_when_configured(rw: &Value) {
    // Issuer and audience.
    let strict = start(
        Store::Memory,
        with_auth(AuthSettings {
            issuer: Some("https://idp.example".into()),
            audience: Some("queen".into()),
            ..hs_settings()
        }),
    )
    .await;
    let with = |iss: &str, aud: &str| {
        let mut c = rw.clone();
        c["iss"] = json!(iss);
        c["aud"] = json!(aud);
        hs256(&c)
    };
    assert_eq!(
        status_with(&strict, &with("https://idp.example", "queen")).await,
        204
    );
    assert_eq!(
        status_with(&strict, &with("https://evil.example", "queen")).await,
        401
    );
    assert_eq!(
        status_with(&strict, &with("https://idp.example", "other")).await,
        401
    );
    assert_eq!(status_with(&strict, &hs256(rw)).await, 401, "no iss at all");
}

/// RS256 and EdDSA with PEM keys, `auto` with a key per algorithm, and settings that lack the key
/// their algorithm needs.
async fn public_key_algorithms_and_auto(rw: &Value, rsa_pub: String) {
    let none = unsigned_token(rw);
    // RS256 with a PEM; algorithm confusion (HS256 keyed with the public key) is refused.
    let rs = start(
        Store::Memory,
        with_auth(AuthSettings {
            public_key_pem: Some(rsa_pub.clone()),
            ..AuthSettings::new(JwtAlgorithm::Rs256)
        }),
    )
    .await;
    assert_eq!(
        status_with(&rs, &rs256(rw, "rsa_private.pem", None)).await,
        204
    );
    assert_eq!(
        status_with(&rs, &rs256(rw, "rsa2_private.pem", None)).await,
        401,
        "another RSA key"
    );
    let confused = encode(
        &Header::new(Algorithm::HS256),
        rw,
        &EncodingKey::from_secret(rsa_pub.as_bytes()),
    )
    .unwrap();
    assert_eq!(status_with(&rs, &confused).await, 401);
    assert_eq!(status_with(&rs, &eddsa(rw, None)).await, 401);

    // EdDSA with a PEM.
    let ed = start(
        Store::Memory,
        with_auth(AuthSettings {
            public_key_pem: Some(fixture("ed25519_public.pem")),
            ..AuthSettings::new(JwtAlgorithm::EdDsa)
        }),
    )
    .await;
    assert_eq!(status_with(&ed, &eddsa(rw, None)).await, 204);
    assert_eq!(
        status_with(&ed, &rs256(rw, "rsa_private.pem", None)).await,
        401
    );

    // auto: each algorithm with its own key; none without one.
    let auto = start(
        Store::Memory,
        with_auth(AuthSettings {
            secret: Some(SECRET.into()),
            public_key_pem: Some(rsa_pub),
            ..AuthSettings::new(JwtAlgorithm::Auto)
        }),
    )
    .await;
    assert_eq!(status_with(&auto, &hs256(rw)).await, 204);
    assert_eq!(
        status_with(&auto, &rs256(rw, "rsa_private.pem", None)).await,
        204
    );
    assert_eq!(
        status_with(&auto, &eddsa(rw, None)).await,
        401,
        "no Ed25519 key configured"
    );
    assert_eq!(status_with(&auto, &none).await, 401);

    // Settings without the key their algorithm needs are refused at start.
    assert!(Authenticator::new(AuthSettings::new(JwtAlgorithm::Hs256)).is_err());
    assert!(Authenticator::new(AuthSettings::new(JwtAlgorithm::Rs256)).is_err());
    assert!(Authenticator::new(AuthSettings {
        public_key_pem: Some("not a pem".into()),
        ..AuthSettings::new(JwtAlgorithm::EdDsa)
    })
    .is_err());
}

/// A JWKS endpoint served by the test: answers whatever `body` holds now, counting fetches.
async fn serve_jwks(body: Arc<Mutex<String>>, fetches: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let (body, fetches) = (body.clone(), fetches.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                fetches.fetch_add(1, Ordering::SeqCst);
                let b = body.lock().unwrap().clone();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                    b.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_keys_by_kid_and_rotation() {
    let body = Arc::new(Mutex::new(fixture("jwks.json")));
    let fetches = Arc::new(AtomicUsize::new(0));
    let jwks = serve_jwks(body.clone(), fetches.clone()).await;
    let b = start(
        Store::Memory,
        with_auth(AuthSettings {
            jwks_url: Some(format!("http://{jwks}/.well-known/jwks.json")),
            ..AuthSettings::new(JwtAlgorithm::Auto)
        }),
    )
    .await;
    let rw = claims("svc", Some("read-write"));
    assert_eq!(
        status_with(&b, &rs256(&rw, "rsa_private.pem", Some("rsa-1"))).await,
        204
    );
    assert_eq!(status_with(&b, &eddsa(&rw, Some("ed-1"))).await, 204);
    assert_eq!(
        status_with(&b, &rs256(&rw, "rsa_private.pem", None)).await,
        204,
        "no kid: every key of the algorithm is tried"
    );
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "one fetch serves every later token"
    );
    // The right kid with the wrong key; a kid the set does not have.
    assert_eq!(
        status_with(&b, &rs256(&rw, "rsa2_private.pem", Some("rsa-1"))).await,
        401
    );
    // The identity provider rotates: a token with the new kid makes the broker fetch again
    // (after the minimum interval between fetches).
    *body.lock().unwrap() = fixture("jwks_rotated.json");
    tokio::time::sleep(std::time::Duration::from_millis(5_200)).await;
    let rotated = rs256(
        &claims("svc2", Some("read-write")),
        "rsa2_private.pem",
        Some("rsa-2"),
    );
    assert_eq!(
        status_with(&b, &rotated).await,
        204,
        "the unknown kid was fetched"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // Made-up kids right after: no fetch storm.
    for i in 0..5 {
        let t = rs256(&rw, "rsa2_private.pem", Some(&format!("made-up-{i}")));
        assert_eq!(status_with(&b, &t).await, 401);
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "unknown kids within 5 s of a fetch fetch nothing"
    );
}

/// Pushes as `sub` through every push path and reads the messages back: each carries `sub`
/// as producerSub whatever the body claimed.
async fn producer_identity(store: Store, name: &str) {
    // A buffer directory of this broker's own (two brokers on one would drain each other's).
    let dir = std::env::temp_dir().join(format!(
        "queen-auth-buffer-{name}-{}-{}",
        std::process::id(),
        now()
    ));
    let config = ServerConfig {
        file_buffer: Some(Arc::new(
            queen_server::buffer::FileBuffer::open(&dir).unwrap(),
        )),
        ..with_auth(hs_settings())
    };
    let b = start(store, config).await;
    let alice = hs256(&claims("alice", Some("admin")));
    let q = "ident";
    assert_eq!(
        send(
            b.addr,
            Some(&alice),
            "POST",
            "/api/v1/push",
            Some(&spoofed_push(q, "json"))
        )
        .await
        .status,
        201
    );
    let tx = json!({"operations": [{"type": "push", "items": [{"queue": q, "transactionId": "txn", "payload": {"tx": "txn"}, "producerSub": "mallory"}]}]});
    assert_eq!(
        send(
            b.addr,
            Some(&alice),
            "POST",
            "/api/v1/transaction",
            Some(&tx)
        )
        .await
        .status,
        200
    );
    // QPB1 with client-compressed frames: the client's blob cannot hold the identity.
    let mut seed = 1u64;
    let batch = queen_raw_client::wire::Batch {
        queue: q.into(),
        partition: "Default".into(),
        payloads: vec![br#"{"tx":"binary"}"#.to_vec()],
        transaction_ids: Some(vec!["binary".into()]),
    };
    let (qpb1, _) = queen_raw_client::wire::push_frames(&[batch], false, &mut seed);
    let mut c = Client::connect(b.addr)
        .await
        .with_header("authorization", &format!("Bearer {alice}"));
    assert_eq!(
        c.post_bytes("/api/v1/push", "application/x-queen-push", &qpb1)
            .await
            .status,
        201
    );
    identity_through_the_failover_buffer(&b, &alice, q).await;
    identity_in_a_framed_pop(&b, &alice, q).await;
    identity_in_dead_letters(&b, &alice).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Through the failover buffer: maintenance on, push, maintenance off, drained; every push so far
/// is delivered with the token's identity.
async fn identity_through_the_failover_buffer(b: &TestBroker, alice: &str, q: &str) {
    // Through the failover buffer: maintenance on, push, maintenance off, drained.
    assert_eq!(
        send(
            b.addr,
            Some(alice),
            "POST",
            "/api/v1/system/maintenance",
            Some(&json!({"enabled": true}))
        )
        .await
        .status,
        200
    );
    let buffered = send(
        b.addr,
        Some(alice),
        "POST",
        "/api/v1/push",
        Some(&spoofed_push(q, "buffered")),
    )
    .await;
    assert_eq!(buffered.json()[0]["status"], "buffered");
    assert_eq!(
        send(
            b.addr,
            Some(alice),
            "POST",
            "/api/v1/system/maintenance",
            Some(&json!({"enabled": false}))
        )
        .await
        .status,
        200
    );
    let seen = common::pop_until(b.addr, Some(alice), q, 4, "producerSub").await;
    let expected: std::collections::BTreeMap<String, Value> = ["json", "txn", "binary", "buffered"]
        .iter()
        .map(|t| (t.to_string(), json!("alice")))
        .collect();
    assert_eq!(seen, expected);
}

/// A framed pop carries the identity in the frame (flags & 2).
async fn identity_in_a_framed_pop(b: &TestBroker, alice: &str, q: &str) {
    // A framed pop carries it in the frame (flags & 2). (It waits: the drain may not have
    // recorded its progress yet, and a push meanwhile queues behind it in the buffer.)
    assert_eq!(
        send(
            b.addr,
            Some(alice),
            "POST",
            "/api/v1/push",
            Some(&spoofed_push(q, "framed"))
        )
        .await
        .status,
        201
    );
    let mut framed = Client::connect(b.addr)
        .await
        .with_header("authorization", &format!("Bearer {alice}"));
    let r = framed
        .get(&format!(
            "/api/v1/pop/queue/{q}?batch=10&wait=true&timeout=5000&frames=true&autoAck=true"
        ))
        .await;
    assert!(
        r.body.starts_with(b"QPF1"),
        "{} {:?}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    let answer = queen_raw_client::wire::read_pop_frames(&r.body);
    let producers: Vec<Option<String>> = answer
        .claims
        .iter()
        .flat_map(|c| c.messages.iter().map(|m| m.producer.clone()))
        .collect();
    assert_eq!(producers, vec![Some("alice".to_string())]);
}

/// Dead letters carry the identity too.
async fn identity_in_dead_letters(b: &TestBroker, alice: &str) {
    // Dead letters carry it too.
    let dq = "ident-dlq";
    send(
        b.addr,
        Some(alice),
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": dq, "options": {"retryLimit": 0, "retryDelay": 0}})),
    )
    .await;
    send(
        b.addr,
        Some(alice),
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": dq, "payload": {"x": 1}}]})),
    )
    .await;
    let popped = send(
        b.addr,
        Some(alice),
        "GET",
        // Waits, as the framed pop above does: this push may queue behind the drain.
        &format!("/api/v1/pop/queue/{dq}?wait=true&timeout=5000"),
        None,
    )
    .await
    .json();
    let m = &popped["messages"][0];
    let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "failed"});
    assert_eq!(
        send(b.addr, Some(alice), "POST", "/api/v1/ack", Some(&ack))
            .await
            .status,
        200
    );
    let dlq = send(
        b.addr,
        Some(alice),
        "GET",
        &format!("/api/v1/dlq?queue={dq}"),
        None,
    )
    .await
    .json();
    assert_eq!(dlq["messages"][0]["producerSub"], "alice", "{dlq}");
}

/// A push that claims to come from someone else: the broker stamps the token's identity instead.
fn spoofed_push(q: &str, tx: &str) -> Value {
    json!({"items": [{"queue": q, "transactionId": tx, "payload": {"tx": tx}, "producerSub": "mallory"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_identity_memory() {
    producer_identity(Store::Memory, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_identity_postgres() {
    producer_identity(Store::Postgres("auth_producer"), "postgres").await;
}

/// Without auth no identity is stamped, and a producerSub in the body is not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_identity_without_auth() {
    let b = start(Store::Memory, ServerConfig::default()).await;
    let push = json!({"items": [{"queue": "anon", "payload": {"n": 1}, "producerSub": "mallory"}]});
    assert_eq!(
        send(b.addr, None, "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    let m = send(
        b.addr,
        None,
        "GET",
        "/api/v1/pop/queue/anon?wait=false",
        None,
    )
    .await
    .json();
    let msg = m["messages"][0].as_object().unwrap();
    assert!(!msg.contains_key("producerSub"), "{msg:?}");
}

/// The verified-token cache: the same token is checked once, a different token is not taken
/// for it, and an expired cached token stops working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_are_exact_and_expire() {
    let auth = Authenticator::new(hs_settings()).unwrap();
    let a = hs256(&claims("a", Some("read-write")));
    let first = auth.verify(&a).await.unwrap();
    let again = auth.verify(&a).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the second check is the cached principal"
    );
    let b = hs256(&claims("b", Some("admin")));
    assert_eq!(auth.verify(&b).await.unwrap().sub.as_deref(), Some("b"));
    // A token that expires 29 s in the past is within the skew now, and cached only until
    // exp + skew: 1 s from now.
    let soon = hs256(&json!({"sub": "c", "role": "read-write", "exp": now() - 29}));
    assert!(auth.verify(&soon).await.is_ok());
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    assert_eq!(auth.verify(&soon).await.unwrap_err().status, 401);
}

/// The real binary with auth on and debug logging: neither the secret nor a token, valid or
/// not, appears in anything it prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_secret_in_the_logs() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_queen"))
        .env_clear()
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("JWT_ENABLED", "true")
        .env("JWT_SECRET", SECRET)
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut up = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            up = true;
            break;
        }
    }
    assert!(up, "the broker listens");
    let good = hs256(&claims("logged", Some("read-write")));
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &claims("mallory", Some("admin")),
        &EncodingKey::from_secret(b"guessed"),
    )
    .unwrap();
    let push = json!({"items": [{"queue": "logs", "payload": {"n": 1}}]});
    assert_eq!(
        send(addr, Some(&good), "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        201
    );
    assert_eq!(
        send(addr, Some(&forged), "POST", "/api/v1/push", Some(&push))
            .await
            .status,
        401
    );
    assert_eq!(
        send(
            addr,
            Some("garbage.token.here"),
            "GET",
            "/api/v1/dlq?queue=logs",
            None
        )
        .await
        .status,
        401
    );
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let printed =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(printed.contains("JWT authentication on"), "{printed}");
    for secret in [SECRET, good.as_str(), forged.as_str(), "garbage.token.here"] {
        assert!(!printed.contains(secret), "printed {secret:?}:\n{printed}");
    }
}
