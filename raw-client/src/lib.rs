//! A minimal HTTP/1.1 client over one keep-alive TCP connection: enough for the tests and the
//! benchmark to speak to the broker exactly as a client does, with no client library in between.
//! Hand-written on purpose: the tests send what a library would refuse or normalize (malformed
//! bodies, bad encodings, oversized requests) and the benchmark must not measure a library's
//! pooling or retries; a real client's behaviour is tested with Queen's own Python client.

#![allow(clippy::expect_used)] // test and benchmark support: an I/O failure ends the run

pub mod wire;

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How long an idle connection is reused. The broker closes a connection idle for its
/// CLIENT_IDLE_TIMEOUT_MS; a client that kept one longer would write into a closed socket. Real
/// clients expire idle connections too (httpx after 5 s), so this is what they do.
const IDLE_REUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// One keep-alive connection (a new one when it was idle longer than real clients keep one).
pub struct Client {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    /// When the last answer was read: the connection owes the broker nothing since.
    idle_since: Option<std::time::Instant>,
    /// Sent with every request (`Authorization`, say), as `name: value` lines.
    extra_headers: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        Client {
            addr,
            reader: BufReader::new(TcpStream::connect(addr).await.expect("connect")),
            idle_since: None,
            extra_headers: String::new(),
        }
    }

    /// Every later request carries this header too.
    pub fn with_header(mut self, name: &str, value: &str) -> Client {
        self.extra_headers.push_str(&format!("{name}: {value}\r\n"));
        self
    }

    /// A fresh connection in place of one idle too long.
    async fn fresh_if_stale(&mut self) {
        if self
            .idle_since
            .take()
            .is_some_and(|t| t.elapsed() >= IDLE_REUSE)
        {
            self.reader = BufReader::new(TcpStream::connect(self.addr).await.expect("connect"));
        }
    }

    /// Sends bytes without waiting for an answer.
    pub async fn write_only(&mut self, request: &[u8]) {
        self.fresh_if_stale().await;
        self.reader
            .get_mut()
            .write_all(request)
            .await
            .expect("write");
    }

    /// Sends raw request bytes and reads one response.
    pub async fn raw(&mut self, request: &[u8]) -> Response {
        self.fresh_if_stale().await;
        self.reader
            .get_mut()
            .write_all(request)
            .await
            .expect("write");
        self.read_response().await
    }

    pub async fn send(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> Response {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: test\r\n{}",
            self.extra_headers
        )
        .into_bytes();
        if let Some(b) = body {
            req.extend_from_slice(
                format!(
                    "content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    b.len()
                )
                .as_bytes(),
            );
            req.extend_from_slice(b);
        } else {
            req.extend_from_slice(b"content-length: 0\r\n\r\n");
        }
        self.raw(&req).await
    }

    /// A POST of a binary body with its content type.
    pub async fn post_bytes(&mut self, path: &str, content_type: &str, body: &[u8]) -> Response {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: test\r\n{}content-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            self.extra_headers,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.raw(&req).await
    }

    pub async fn get(&mut self, path: &str) -> Response {
        self.send("GET", path, None).await
    }

    pub async fn post(&mut self, path: &str, body: &serde_json::Value) -> Response {
        let b = serde_json::to_vec(body).expect("json");
        self.send("POST", path, Some(&b)).await
    }

    pub async fn read_response(&mut self) -> Response {
        let mut line = String::new();
        self.reader.read_line(&mut line).await.expect("status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = vec![];
        loop {
            let mut h = String::new();
            self.reader.read_line(&mut h).await.expect("header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).await.expect("body");
        self.idle_since = Some(std::time::Instant::now());
        Response {
            status,
            headers,
            body,
        }
    }
}
