//! HTTP plumbing: bounded bodies, JSON answers, errors, query and path decoding; `auth` (who
//! may call what), `wire` (request bodies and their validation) and `deadline` (a request's
//! storage deadline) beside it.

pub mod auth;
pub(crate) mod deadline;
pub mod wire;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;

pub type Body = Full<Bytes>;
pub type Reply = Response<Body>;

/// A request that cannot be served, with its status and message.
#[derive(Debug)]
pub struct Failure {
    pub status: StatusCode,
    pub message: String,
    /// The storage error behind a 5xx, so the one place that answers failures can count and
    /// log it (`Broker::note_storage_error`).
    pub storage: Option<queen_core::storage::StorageError>,
    /// A machine-readable error code (`body.code`), for the surfaces whose clients branch on it.
    pub code: Option<&'static str>,
}

impl Failure {
    /// A 400 with the client's error code.
    pub fn coded(code: &'static str, message: impl Into<String>) -> Self {
        Failure {
            code: Some(code),
            ..Failure::bad(message)
        }
    }
    pub fn bad(message: impl Into<String>) -> Self {
        Failure {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            storage: None,
            code: None,
        }
    }
    pub fn server(message: impl Into<String>) -> Self {
        Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            storage: None,
            code: None,
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Failure {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            storage: None,
            code: None,
        }
    }
}

impl From<queen_core::storage::StorageError> for Failure {
    fn from(e: queen_core::storage::StorageError) -> Self {
        use queen_core::storage::StorageError as E;
        let failure = match &e {
            E::Invalid(m) => Failure::bad(m.clone()),
            E::Conflict(m) => Failure {
                status: StatusCode::CONFLICT,
                message: m.clone(),
                storage: None,
                code: None,
            },
            E::Unavailable(m) | E::Contention(m) => Failure::unavailable(m.clone()),
            E::EncryptionRequired { .. } => Failure::server(format!(
                "{e}, and this broker has no QUEEN_ENCRYPTION_KEY: nothing was stored"
            )),
            E::Internal(m) => Failure::server(m.clone()),
        };
        let storage = failure.status.is_server_error().then_some(e);
        Failure { storage, ..failure }
    }
}

fn with_headers(mut r: Reply, json: bool) -> Reply {
    let h = r.headers_mut();
    if json {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("Content-Type, Authorization"),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("86400"));
    r
}

pub fn json(status: StatusCode, value: &Value) -> Reply {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    with_headers(r, true)
}

pub fn json_bytes(status: StatusCode, bytes: Vec<u8>) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    with_headers(r, true)
}

pub fn text(status: StatusCode, body: String, content_type: &'static str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    with_headers(r, false)
}

/// A binary answer with its content type.
pub fn bytes(status: StatusCode, body: Vec<u8>, content_type: &'static str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    with_headers(r, false)
}

/// 204 with no body at all (no Content-Length announcing one either).
pub fn no_content() -> Reply {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    with_headers(r, false)
}

/// Seconds a client should wait before retrying a 503: the database is restarting, unreachable
/// or contended, which is a matter of a second or two.
pub const RETRY_AFTER_SECS: &str = "1";

pub fn error(f: &Failure) -> Reply {
    let body = match f.code {
        Some(code) => match surface_code(f.status, code) {
            Some(surface) => {
                serde_json::json!({ "error": f.message, "code": surface, "reason": code })
            }
            None => serde_json::json!({ "error": f.message, "code": code }),
        },
        None => serde_json::json!({ "error": f.message }),
    };
    let mut r = json(f.status, &body);
    if f.status == StatusCode::SERVICE_UNAVAILABLE || f.status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static(RETRY_AFTER_SECS));
    }
    if f.status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    r
}

/// The code of a refused request on the KV, timers and locks surfaces, whose clients branch on a
/// closed set: Queen's clients expect `kv_bad_request` / `timers_bad_request` for any malformed
/// op, with the specific code (`kv_invalid_namespace`, ...) as `reason`. `None`: the code is
/// answered as it is.
fn surface_code(status: StatusCode, code: &str) -> Option<&'static str> {
    if status != StatusCode::BAD_REQUEST {
        return None;
    }
    [
        ("kv_", "kv_bad_request"),
        ("timers_", "timers_bad_request"),
        ("locks_", "locks_bad_request"),
    ]
    .into_iter()
    .find(|(prefix, _)| code.starts_with(prefix))
    .map(|(_, surface)| surface)
}

/// Reads the whole body, refusing more than `limit` bytes, and a body that stops arriving: no
/// byte for `idle` answers 408 (a client that stalled mid-body would otherwise hold the request
/// until the route's storage deadline, and be told the database failed).
pub async fn read_body(
    mut body: Incoming,
    limit: usize,
    idle: Option<std::time::Duration>,
) -> Result<Bytes, Failure> {
    let too_large = || Failure {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("request body larger than {limit} bytes"),
        storage: None,
        code: None,
    };
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    // The common body arrives in one frame: kept as it came, copied only when a second follows.
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    loop {
        let next = match idle {
            Some(idle) => tokio::time::timeout(idle, body.frame())
                .await
                .map_err(|_| Failure {
                    status: StatusCode::REQUEST_TIMEOUT,
                    message: format!(
                        "the request body stopped arriving: no byte for {} ms",
                        idle.as_millis()
                    ),
                    storage: None,
                    code: None,
                })?,
            None => body.frame().await,
        };
        let frame = match next {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                return Err(Failure::bad(format!(
                    "could not read the request body: {e}"
                )))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing of the body
        };
        let held = first.as_ref().map_or(0, Bytes::len) + joined.len();
        if held + data.len() > limit {
            return Err(too_large());
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(earlier) => {
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

/// Percent-decodes one path segment or query component; `plus_is_space` for query strings.
pub fn percent_decode(s: &str, plus_is_space: bool) -> Result<String, Failure> {
    // percent-encoding passes a malformed escape through as text; from a client it is a mistake
    // worth a 400, not a name with a literal '%' in it.
    let malformed = s.match_indices('%').any(|(i, _)| {
        !s.get(i + 1..i + 3)
            .is_some_and(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
    });
    if malformed {
        return Err(Failure::bad(format!("malformed percent-encoding in {s:?}")));
    }
    let spaced;
    let s = if plus_is_space && s.contains('+') {
        spaced = s.replace('+', " ");
        spaced.as_str()
    } else {
        s
    };
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| Failure::bad("names and parameters must be UTF-8"))
}

/// Decoded query pairs, in order.
pub fn query_pairs(query: Option<&str>) -> Result<Vec<(String, String)>, Failure> {
    let Some(q) = query else { return Ok(vec![]) };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((percent_decode(k, true)?, percent_decode(v, true)?))
        })
        .collect()
}

/// A route's answer: a reply now, or one a pop's driver task sends when it has one.
pub enum Routed {
    Now(Reply),
    Later(tokio::sync::oneshot::Receiver<Reply>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_paths_and_queries() {
        assert_eq!(percent_decode("my%20queue", false).unwrap(), "my queue");
        assert_eq!(percent_decode("a+b", false).unwrap(), "a+b");
        assert_eq!(percent_decode("a+b", true).unwrap(), "a b");
        assert!(percent_decode("bad%2", false).is_err());
        assert!(percent_decode("bad%zz", false).is_err());
        assert!(percent_decode("bad%", false).is_err());
        assert_eq!(percent_decode("a%2Bb+c", true).unwrap(), "a+b c");
        assert!(percent_decode("%ff%fe", false).is_err(), "not UTF-8");
        let q = query_pairs(Some("batch=10&wait=true&consumerGroup=g%2F1&flag")).unwrap();
        assert_eq!(q[2], ("consumerGroup".to_string(), "g/1".to_string()));
        assert_eq!(q[3], ("flag".to_string(), String::new()));
    }
}
