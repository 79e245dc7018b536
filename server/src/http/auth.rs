//! JWT authentication with Queen's settings (`JWT_*`), and the access level of each route.
//!
//! A token comes as `Authorization: Bearer <jwt>` (the prefix in any case) or bare. It is checked
//! by `jsonwebtoken` (RustCrypto's primitives): the signature under the configured algorithm
//! (`alg: none` and any other algorithm are refused before any key is tried), `exp` and `nbf`
//! within `JWT_CLOCK_SKEW`, `iss` and `aud` when configured. Its role comes from `JWT_ROLES_CLAIM`
//! (a string) and `JWT_ROLES_ARRAY_CLAIM` (an array): the highest one named by
//! `JWT_ROLE_ADMIN` / `JWT_ROLE_READ_WRITE` / `JWT_ROLE_READ_ONLY` counts; a token with none of
//! them reaches no protected route.
//!
//! HS256 signatures are compared in constant time (RustCrypto's `hmac` verify_slice, under
//! jsonwebtoken). A verified token is cached under its SHA-256 digest until it expires (at most a minute, so a
//! key rotated out of the JWKS stops working soon): a client on one connection, or many sending
//! the same service token, pays one signature check a minute rather than one a request. A token
//! never appears in a log or an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::header::{HeaderMap, AUTHORIZATION};
use hyper::StatusCode;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::helpers::lock;
use crate::http::Failure;

/// What a route requires; each level includes the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    ReadOnly,
    ReadWrite,
    Admin,
}

/// `JWT_ALGORITHM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JwtAlgorithm {
    Hs256,
    Rs256,
    EdDsa,
    /// Whatever the token's header names among the three, with the key configured for it.
    Auto,
}

impl std::str::FromStr for JwtAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "hs256" => Ok(JwtAlgorithm::Hs256),
            "rs256" => Ok(JwtAlgorithm::Rs256),
            "eddsa" => Ok(JwtAlgorithm::EdDsa),
            "auto" => Ok(JwtAlgorithm::Auto),
            _ => Err(format!(
                "JWT_ALGORITHM must be HS256, RS256, EdDSA or auto, got {s:?}"
            )),
        }
    }
}

impl JwtAlgorithm {
    fn allows(self, alg: Algorithm) -> bool {
        match self {
            JwtAlgorithm::Hs256 => alg == Algorithm::HS256,
            JwtAlgorithm::Rs256 => alg == Algorithm::RS256,
            JwtAlgorithm::EdDsa => alg == Algorithm::EdDSA,
            JwtAlgorithm::Auto => {
                matches!(alg, Algorithm::HS256 | Algorithm::RS256 | Algorithm::EdDSA)
            }
        }
    }
}

/// The `JWT_*` settings (auth is on when these exist at all).
#[derive(Clone)]
pub struct AuthSettings {
    pub algorithm: JwtAlgorithm,
    pub secret: Option<String>,
    pub public_key_pem: Option<String>,
    pub jwks_url: Option<String>,
    pub jwks_refresh: Duration,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub clock_skew_secs: u64,
    pub skip_paths: Vec<String>,
    pub roles_claim: String,
    pub roles_array_claim: String,
    pub role_admin: String,
    pub role_read_write: String,
    pub role_read_only: String,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("algorithm", &self.algorithm)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("public_key_pem", &self.public_key_pem.is_some())
            .field("jwks_url", &self.jwks_url)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("skip_paths", &self.skip_paths)
            .finish_non_exhaustive()
    }
}

/// Queen's defaults.
pub const DEFAULT_SKIP_PATHS: &str = "/health,/metrics,/metrics/prometheus,/";
pub const DEFAULT_ROLES_CLAIM: &str = "role";
pub const DEFAULT_ROLES_ARRAY_CLAIM: &str = "roles";
pub const DEFAULT_ROLE_ADMIN: &str = "admin";
pub const DEFAULT_ROLE_READ_WRITE: &str = "read-write";
pub const DEFAULT_ROLE_READ_ONLY: &str = "read-only";
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 30;
pub const DEFAULT_JWKS_REFRESH_SECS: u64 = 3600;

impl AuthSettings {
    /// Queen's defaults for everything but the algorithm and its keys.
    pub fn new(algorithm: JwtAlgorithm) -> AuthSettings {
        AuthSettings {
            algorithm,
            secret: None,
            public_key_pem: None,
            jwks_url: None,
            jwks_refresh: Duration::from_secs(DEFAULT_JWKS_REFRESH_SECS),
            issuer: None,
            audience: None,
            clock_skew_secs: DEFAULT_CLOCK_SKEW_SECS,
            skip_paths: DEFAULT_SKIP_PATHS.split(',').map(str::to_string).collect(),
            roles_claim: DEFAULT_ROLES_CLAIM.into(),
            roles_array_claim: DEFAULT_ROLES_ARRAY_CLAIM.into(),
            role_admin: DEFAULT_ROLE_ADMIN.into(),
            role_read_write: DEFAULT_ROLE_READ_WRITE.into(),
            role_read_only: DEFAULT_ROLE_READ_ONLY.into(),
        }
    }
}

/// Who sent a request.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Auth is off, or the path is public: every route is open and no identity is known.
    Open,
    Token(Arc<Principal>),
}

#[derive(Debug)]
pub struct Principal {
    /// The token's `sub`: the producer identity pushed messages carry.
    pub sub: Option<String>,
    /// The highest role the token names; `None`: no role this broker knows.
    pub access: Option<Access>,
}

impl Caller {
    /// 403 when the token's role is below `needed`.
    pub fn require(&self, needed: Access) -> Result<(), Failure> {
        match self {
            Caller::Open => Ok(()),
            Caller::Token(p) if p.access.is_some_and(|a| a >= needed) => Ok(()),
            Caller::Token(_) => Err(Failure {
                status: StatusCode::FORBIDDEN,
                message: "Insufficient permissions".into(),
                storage: None,
                code: None,
            }),
        }
    }

    /// The identity a push stamps on its messages (`producerSub`).
    pub fn producer(&self) -> Option<&str> {
        match self {
            Caller::Open => None,
            Caller::Token(p) => p.sub.as_deref(),
        }
    }
}

fn unauthorized(message: impl Into<String>) -> Failure {
    Failure {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        storage: None,
        code: None,
    }
}

/// A key and the algorithm it verifies.
struct VerifyKey {
    alg: Algorithm,
    key: DecodingKey,
}

#[derive(Default)]
struct Jwks {
    by_kid: BTreeMap<String, VerifyKey>,
    without_kid: Vec<VerifyKey>,
    fetched: Option<Instant>,
}

struct CachedToken {
    digest: [u8; 32],
    principal: Arc<Principal>,
    until: SystemTime,
}

/// Most verified tokens kept; past it the cache is emptied (a flood of distinct tokens costs
/// their signature checks, never unbounded memory).
const TOKEN_CACHE_MAX: usize = 10_000;
/// Longest a verified token is trusted without a new signature check.
const TOKEN_CACHE_SECS: u64 = 60;
/// Fewest seconds between two JWKS fetches for unknown key ids (a stream of made-up `kid`s
/// must not become a stream of fetches).
const JWKS_REFETCH_MIN: Duration = Duration::from_secs(5);

pub struct Authenticator {
    settings: AuthSettings,
    static_keys: Vec<VerifyKey>,
    jwks: tokio::sync::RwLock<Jwks>,
    /// Serializes JWKS fetches.
    fetching: tokio::sync::Mutex<()>,
    http: reqwest::Client,
    /// Keyed by the first 8 bytes of the token's digest; the whole digest is compared in
    /// constant time.
    cache: Mutex<HashMap<u64, CachedToken>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Checks the settings: an algorithm needs its key (a secret for HS256, a PEM or a JWKS URL
    /// for RS256 and EdDSA).
    pub fn new(settings: AuthSettings) -> Result<Authenticator, String> {
        let mut static_keys = vec![];
        let hs = matches!(settings.algorithm, JwtAlgorithm::Hs256 | JwtAlgorithm::Auto);
        let asym = matches!(
            settings.algorithm,
            JwtAlgorithm::Rs256 | JwtAlgorithm::EdDsa | JwtAlgorithm::Auto
        );
        if let Some(secret) = settings.secret.as_deref().filter(|s| !s.is_empty()) {
            if hs {
                static_keys.push(VerifyKey {
                    alg: Algorithm::HS256,
                    key: DecodingKey::from_secret(secret.as_bytes()),
                });
            }
        }
        if let Some(pem) = settings.public_key_pem.as_deref().filter(|s| !s.is_empty()) {
            if asym {
                // A PEM in an environment variable often has its newlines written as \n.
                let pem = pem.replace("\\n", "\n");
                let rsa = DecodingKey::from_rsa_pem(pem.as_bytes()).ok();
                let ed = DecodingKey::from_ed_pem(pem.as_bytes()).ok();
                let key = match (settings.algorithm, rsa, ed) {
                    (JwtAlgorithm::Rs256 | JwtAlgorithm::Auto, Some(key), _) => VerifyKey {
                        alg: Algorithm::RS256,
                        key,
                    },
                    (JwtAlgorithm::EdDsa | JwtAlgorithm::Auto, _, Some(key)) => VerifyKey {
                        alg: Algorithm::EdDSA,
                        key,
                    },
                    _ => {
                        return Err(format!(
                            "JWT_PUBLIC_KEY is not a {} public key in PEM form",
                            match settings.algorithm {
                                JwtAlgorithm::EdDsa => "Ed25519",
                                JwtAlgorithm::Rs256 => "RSA",
                                _ => "RSA or Ed25519",
                            }
                        ))
                    }
                };
                static_keys.push(key);
            }
        }
        let jwks = settings.jwks_url.as_deref().is_some_and(|u| !u.is_empty());
        if static_keys.is_empty() && !(asym && jwks) {
            return Err(match settings.algorithm {
                JwtAlgorithm::Hs256 => "JWT_ALGORITHM HS256 needs JWT_SECRET".into(),
                JwtAlgorithm::Rs256 | JwtAlgorithm::EdDsa => {
                    "JWT_ALGORITHM RS256 and EdDSA need JWT_PUBLIC_KEY or JWT_JWKS_URL".into()
                }
                JwtAlgorithm::Auto => {
                    "JWT_ALGORITHM auto needs JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL".into()
                }
            });
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("building the JWKS client: {e}"))?;
        Ok(Authenticator {
            settings,
            static_keys,
            jwks: tokio::sync::RwLock::new(Jwks::default()),
            fetching: tokio::sync::Mutex::new(()),
            http,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Who sent the request: `Open` on a public path, else the verified token (401 without a
    /// valid one).
    pub async fn authenticate(&self, path: &str, headers: &HeaderMap) -> Result<Caller, Failure> {
        if self.settings.skip_paths.iter().any(|p| p == path) {
            return Ok(Caller::Open);
        }
        let token = bearer_token(headers).ok_or_else(|| unauthorized("Authentication required"))?;
        self.verify(token).await.map(Caller::Token)
    }

    /// A token's principal, from the cache or a signature check.
    pub async fn verify(&self, token: &str) -> Result<Arc<Principal>, Failure> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let slot = u64::from_le_bytes(digest[..8].try_into().unwrap_or([0; 8]));
        let now = SystemTime::now();
        if let Some(hit) = lock(&self.cache).get(&slot) {
            if bool::from(hit.digest.ct_eq(&digest)) && hit.until > now {
                return Ok(hit.principal.clone());
            }
        }
        let (principal, exp) = self.check_signature(token).await?;
        let principal = Arc::new(principal);
        let mut until = now + Duration::from_secs(TOKEN_CACHE_SECS);
        if let Some(exp) = exp {
            until =
                until.min(UNIX_EPOCH + Duration::from_secs(exp + self.settings.clock_skew_secs));
        }
        let mut cache = lock(&self.cache);
        if cache.len() >= TOKEN_CACHE_MAX {
            cache.retain(|_, c| c.until > now);
            if cache.len() >= TOKEN_CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(
            slot,
            CachedToken {
                digest,
                principal: principal.clone(),
                until,
            },
        );
        Ok(principal)
    }

    async fn check_signature(&self, token: &str) -> Result<(Principal, Option<u64>), Failure> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| unauthorized(format!("Invalid token: {}", reason(e.kind()))))?;
        if !self.settings.algorithm.allows(header.alg) {
            return Err(unauthorized(format!(
                "Invalid token: algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.settings.clock_skew_secs;
        validation.validate_nbf = true;
        validation.required_spec_claims.clear();
        // A configured issuer or audience is required, not only checked when present.
        if let Some(iss) = self.settings.issuer.as_ref().filter(|i| !i.is_empty()) {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        match self.settings.audience.as_ref().filter(|a| !a.is_empty()) {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        let mut last = ErrorKind::InvalidSignature;
        for key in self.static_keys.iter().filter(|k| k.alg == header.alg) {
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => return Ok(self.principal(&data.claims)),
                Err(e) => last = e.into_kind(),
            }
        }
        if self
            .settings
            .jwks_url
            .as_deref()
            .is_some_and(|u| !u.is_empty())
        {
            match self.jwks_verify(token, &header, &validation).await {
                Ok(Some(claims)) => return Ok(self.principal(&claims)),
                Ok(None) => {}
                Err(kind) => last = kind,
            }
        }
        Err(unauthorized(format!("Invalid token: {}", reason(&last))))
    }

    /// Verifies against the JWKS: the key named by `kid` (fetched again when unknown), else
    /// every key of the token's algorithm. `Ok(None)`: no key applies.
    async fn jwks_verify(
        &self,
        token: &str,
        header: &jsonwebtoken::Header,
        validation: &Validation,
    ) -> Result<Option<Value>, ErrorKind> {
        let stale = {
            let jwks = self.jwks.read().await;
            let unknown_kid = header
                .kid
                .as_ref()
                .is_some_and(|k| !jwks.by_kid.contains_key(k));
            match jwks.fetched {
                None => true,
                Some(t) => {
                    t.elapsed() >= self.settings.jwks_refresh
                        || (unknown_kid && t.elapsed() >= JWKS_REFETCH_MIN)
                }
            }
        };
        if stale {
            self.refresh_jwks().await;
        }
        let jwks = self.jwks.read().await;
        let keys: Vec<&VerifyKey> = match &header.kid {
            Some(kid) => jwks.by_kid.get(kid).into_iter().collect(),
            None => jwks
                .by_kid
                .values()
                .chain(jwks.without_kid.iter())
                .collect(),
        };
        let mut last = None;
        for key in keys.into_iter().filter(|k| k.alg == header.alg) {
            match jsonwebtoken::decode::<Value>(token, &key.key, validation) {
                Ok(data) => return Ok(Some(data.claims)),
                Err(e) => last = Some(e.into_kind()),
            }
        }
        last.map_or(Ok(None), Err)
    }

    /// Fetches the JWKS; on failure the keys already known stay (and the failure is logged).
    async fn refresh_jwks(&self) {
        let Some(url) = self.settings.jwks_url.clone() else {
            return;
        };
        let _one = self.fetching.lock().await;
        // Another request may have fetched while this one waited.
        if self
            .jwks
            .read()
            .await
            .fetched
            .is_some_and(|t| t.elapsed() < JWKS_REFETCH_MIN)
        {
            return;
        }
        let fetched = async {
            let response = self
                .http
                .get(&url)
                .send()
                .await
                .map_err(|e| format!("fetching: {e}"))?;
            if !response.status().is_success() {
                return Err(format!("answered {}", response.status()));
            }
            let body = response
                .bytes()
                .await
                .map_err(|e| format!("reading: {e}"))?;
            serde_json::from_slice::<JwkSet>(&body).map_err(|e| format!("not a JWKS: {e}"))
        }
        .await;
        let mut jwks = self.jwks.write().await;
        jwks.fetched = Some(Instant::now());
        match fetched {
            Ok(set) => {
                let (mut by_kid, mut without_kid) = (BTreeMap::new(), vec![]);
                for jwk in &set.keys {
                    let alg = match &jwk.algorithm {
                        AlgorithmParameters::RSA(_) => Algorithm::RS256,
                        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
                        // HS keys are never published, and this broker takes no ES tokens.
                        _ => continue,
                    };
                    let Ok(key) = DecodingKey::from_jwk(jwk) else {
                        tracing::warn!(kid = ?jwk.common.key_id, "JWKS: a key that cannot be used is skipped");
                        continue;
                    };
                    let key = VerifyKey { alg, key };
                    match &jwk.common.key_id {
                        Some(kid) => {
                            by_kid.insert(kid.clone(), key);
                        }
                        None => without_kid.push(key),
                    }
                }
                tracing::info!(keys = by_kid.len() + without_kid.len(), "JWKS fetched");
                jwks.by_kid = by_kid;
                jwks.without_kid = without_kid;
            }
            Err(e) => {
                tracing::warn!(url = %url, error = %e, "JWKS refresh failed; the known keys stay")
            }
        }
    }

    fn principal(&self, claims: &Value) -> (Principal, Option<u64>) {
        let s = &self.settings;
        let level = |name: &str| {
            if name == s.role_admin {
                Some(Access::Admin)
            } else if name == s.role_read_write {
                Some(Access::ReadWrite)
            } else if name == s.role_read_only {
                Some(Access::ReadOnly)
            } else {
                None
            }
        };
        let single = claims.get(&s.roles_claim).and_then(Value::as_str);
        let many = claims
            .get(&s.roles_array_claim)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        let access = single.into_iter().chain(many).filter_map(level).max();
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let exp = claims.get("exp").and_then(Value::as_u64);
        (Principal { sub, access }, exp)
    }
}

/// The token of an `Authorization` header: after a `Bearer ` prefix in any case, or the whole
/// value.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let token = match value.get(..6) {
        Some(prefix)
            if prefix.eq_ignore_ascii_case("bearer")
                && value[6..].starts_with(|c: char| c.is_ascii_whitespace()) =>
        {
            value[6..].trim_start()
        }
        // "Bearer" alone: a prefix with no token.
        Some(prefix) if prefix.eq_ignore_ascii_case("bearer") && value.len() == 6 => "",
        _ => value,
    };
    (!token.is_empty()).then_some(token)
}

fn reason(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "expired",
        ErrorKind::ImmatureSignature => "not valid yet",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::MissingRequiredClaim(_) => "a required claim is missing",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidAlgorithm => "algorithm not accepted",
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::InvalidToken
        | ErrorKind::Base64(_)
        | ErrorKind::Json(_)
        | ErrorKind::Utf8(_) => "malformed",
        _ => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn bearer_prefix_in_any_case_or_none() {
        assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("bEaReR   abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let secret = "do-not-print-this-secret";
        let auth = Authenticator::new(AuthSettings {
            secret: Some(secret.into()),
            ..AuthSettings::new(JwtAlgorithm::Hs256)
        })
        .unwrap();
        let shown = format!("{auth:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("<set>"));
    }

    #[test]
    fn algorithms_parse_and_gate() {
        assert_eq!(
            "hs256".parse::<JwtAlgorithm>().unwrap(),
            JwtAlgorithm::Hs256
        );
        assert_eq!(
            "EdDSA".parse::<JwtAlgorithm>().unwrap(),
            JwtAlgorithm::EdDsa
        );
        assert!("none".parse::<JwtAlgorithm>().is_err());
        assert!(!JwtAlgorithm::Rs256.allows(Algorithm::HS256));
        assert!(JwtAlgorithm::Auto.allows(Algorithm::EdDSA));
        assert!(!JwtAlgorithm::Auto.allows(Algorithm::HS512));
    }
}
