//! `POST /api/v1/kv` (every op, index-aligned results) and the path form
//! `GET/PUT/DELETE /api/v1/kv/{ns}/{key}` with `ETag` / `If-Match` / `If-None-Match` for curl
//! users. The rules are `queen_core::kv`; storage runs a call in one transaction.

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderValue, ETAG, IF_MATCH, IF_NONE_MATCH};
use hyper::StatusCode;
use queen_core::kv::{self, KvOp, LOCKS_NAMESPACE};
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{self, Failure, Reply};

/// Parses a call's ops; a write into the locks' namespace is refused (permits are written only
/// by `POST /api/v1/locks`, or a holder could be forged).
pub(crate) fn parse_ops(broker: &Broker, raw: &[Value]) -> Result<Vec<KvOp>, Failure> {
    let ops = kv::parse_ops(raw, &broker.config.kv_limits)
        .map_err(|e| Failure::coded(e.code, e.message))?;
    if let Some(i) = ops
        .iter()
        .position(|op| op.writes() && op.namespace() == LOCKS_NAMESPACE)
    {
        return Err(Failure::coded(
            "kv_reserved_namespace",
            format!("operations[{i}]: {LOCKS_NAMESPACE} is written only through /api/v1/locks"),
        ));
    }
    Ok(ops)
}

/// The `operations` array of a KV, locks or timers call.
pub(crate) fn operations(body: &[u8], code: &'static str) -> Result<Vec<Value>, Failure> {
    let parsed: Value = serde_json::from_slice(body)
        .map_err(|e| Failure::coded(code, format!("body is not JSON: {e}")))?;
    match parsed.get("operations") {
        Some(Value::Array(ops)) => Ok(ops.clone()),
        _ => Err(Failure::coded(code, "operations array required")),
    }
}

pub async fn batch(broker: &Arc<Broker>, body: &[u8]) -> Result<Reply, Failure> {
    let raw = operations(body, "kv_invalid_operation")?;
    let ops = parse_ops(broker, &raw)?;
    if ops.is_empty() {
        return Ok(http::json(StatusCode::OK, &json!({"results": []})));
    }
    let out = broker.kv_batch(ops).await?;
    // Each result names its operation's index (results[i] answers operations[i]).
    let results: Vec<Value> = out
        .results
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            if let Some(o) = r.as_object_mut() {
                o.insert("index".into(), json!(i));
            }
            r
        })
        .collect();
    let mut answer = json!({"results": results});
    if let Some(i) = out.failed {
        answer["committed"] = json!(false);
        answer["reason"] = json!("kv_precondition");
        answer["failedIndex"] = json!(i);
    }
    Ok(http::json(StatusCode::OK, &answer))
}

fn etag(version: &Value) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("\"{}\"", version.as_i64()?)).ok()
}

/// A version named by `If-Match: "N"` (or `If-None-Match: *`, which is version 0: absent).
fn precondition(headers: &HeaderMap) -> Result<Option<i64>, Failure> {
    if let Some(v) = headers.get(IF_MATCH) {
        let text = v.to_str().unwrap_or("").trim().trim_matches('"');
        return text
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| {
                Failure::coded("kv_invalid_operation", "If-Match takes one ETag \"N\"")
            });
    }
    match headers
        .get(IF_NONE_MATCH)
        .map(|v| v.to_str().unwrap_or("").trim())
    {
        Some("*") => Ok(Some(0)),
        _ => Ok(None),
    }
}

/// Runs one op through the batch path and answers its element with a status of its own.
async fn one(broker: &Arc<Broker>, op: Value) -> Result<Value, Failure> {
    let ops = parse_ops(broker, &[op])?;
    let out = broker.kv_batch(ops).await?;
    out.results
        .into_iter()
        .next()
        .ok_or_else(|| Failure::server("kv: no result for a single-op call"))
}

fn with_etag(status: StatusCode, answer: &Value) -> Reply {
    let mut reply = http::json(status, answer);
    if let Some(tag) = etag(&answer["version"]) {
        reply.headers_mut().insert(ETAG, tag);
    }
    reply
}

pub async fn get(
    broker: &Arc<Broker>,
    ns: &str,
    key: &str,
    headers: &HeaderMap,
) -> Result<Reply, Failure> {
    let answer = one(broker, json!({"op": "get", "ns": ns, "key": key})).await?;
    if answer["found"] != true {
        return Ok(http::json(StatusCode::NOT_FOUND, &answer));
    }
    let current = etag(&answer["version"]);
    if let (Some(tag), Some(seen)) = (current, headers.get(IF_NONE_MATCH)) {
        if seen.as_bytes() == tag.as_bytes() {
            let mut reply = http::json(StatusCode::NOT_MODIFIED, &json!({}));
            reply.headers_mut().insert(ETAG, tag);
            return Ok(reply);
        }
    }
    Ok(with_etag(StatusCode::OK, &answer))
}

pub async fn put(
    broker: &Arc<Broker>,
    ns: &str,
    key: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Reply, Failure> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Failure::coded(
            "kv_invalid_operation",
            format!("the body is the value, as JSON: {e}"),
        )
    })?;
    let mut op = json!({"op": "put", "ns": ns, "key": key, "value": value});
    for (name, v) in http::query_pairs(query)? {
        match name.as_str() {
            "ttlSeconds" => {
                op["ttlSeconds"] = json!(v.parse::<u64>().map_err(|_| Failure::coded(
                    "kv_invalid_ttl",
                    "ttlSeconds must be a whole number above zero"
                ))?)
            }
            "forever" if v == "true" => op["forever"] = json!(true),
            _ => {}
        }
    }
    if let Some(expect) = precondition(headers)? {
        op["expect"] = json!(expect);
    }
    let answer = one(broker, op).await?;
    let status = if answer["applied"] == true {
        StatusCode::OK
    } else {
        StatusCode::PRECONDITION_FAILED
    };
    Ok(with_etag(status, &answer))
}

pub async fn delete(
    broker: &Arc<Broker>,
    ns: &str,
    key: &str,
    headers: &HeaderMap,
) -> Result<Reply, Failure> {
    let mut op = json!({"op": "delete", "ns": ns, "key": key});
    if let Some(expect) = precondition(headers)? {
        op["expect"] = json!(expect);
    }
    let answer = one(broker, op).await?;
    let status = match (answer["applied"] == true, answer["reason"].as_str()) {
        (true, _) => StatusCode::OK,
        (false, Some("absent")) => StatusCode::NOT_FOUND,
        (false, _) => StatusCode::PRECONDITION_FAILED,
    };
    Ok(http::json(status, &answer))
}
