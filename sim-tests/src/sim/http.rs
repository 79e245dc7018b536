//! The simulated clients' HTTP/1.1: the real wire (hyper's client) over a turmoil TCP stream,
//! one connection per request, every request bounded by a timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// What came back: a status and a JSON body (Null when empty), or nothing (`Err`): a refused or
/// broken connection, or no answer in time. A request without an answer may still have been
/// applied.
pub type Answer = Result<(u16, Value), String>;

pub async fn request(
    host: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Answer {
    match tokio::time::timeout(timeout, exchange(host, method, path, body)).await {
        Ok(r) => r,
        Err(_) => Err("timed out".into()),
    }
}

async fn exchange(host: &str, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let stream = turmoil::net::TcpStream::connect((host, 6632))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(bytes))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = resp.status().as_u16();
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    let json = if collected.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&collected).map_err(|e| format!("json: {e}"))?
    };
    Ok((status, json))
}
