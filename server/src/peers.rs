//! Requests to other brokers of the deployment (an ephemeral call forwarded to its queue's
//! owner): HTTP/1.1 over kept-alive connections, a few idle ones kept per peer. hyper's own
//! client connection, since the server already links hyper; a pooling client crate would add a
//! second HTTP stack for this one use.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::helpers::lock;

/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 16;

/// How long an idle connection is kept for reuse. A peer closes a connection idle for its
/// CLIENT_IDLE_TIMEOUT_MS (at least 10 s), and a request sent just as it closes fails; reusing
/// only connections idle for less than this never meets that close.
pub const PEER_IDLE_REUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// A connection to a peer, ready for requests.
pub type PeerSender = SendRequest<Full<Bytes>>;

/// Opens a connection to a peer's address. Production dials TCP (`tcp_connector`); the
/// deterministic simulation dials its own network, so forwards between its brokers run there.
pub type PeerConnector = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<PeerSender, String>> + Send>>
        + Send
        + Sync,
>;

/// HTTP/1.1 over an open stream to `address`; the connection's task runs until either side
/// closes it.
pub async fn handshake<S>(stream: S, address: &str) -> Result<PeerSender, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {address}: {e}"))?;
    tokio::spawn(async move {
        // Ends when the peer or this side closes; nothing to report.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Dials peers over TCP.
pub fn tcp_connector() -> PeerConnector {
    Arc::new(|address: String| {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(&address)
                .await
                .map_err(|e| format!("connecting to {address}: {e}"))?;
            let _ = stream.set_nodelay(true);
            handshake(stream, &address).await
        })
    })
}

pub struct Peers {
    /// Per peer, its idle connections with when each went idle.
    idle: Mutex<BTreeMap<String, Vec<(PeerSender, tokio::time::Instant)>>>,
    connect: PeerConnector,
}

impl Peers {
    pub fn new(connect: PeerConnector) -> Self {
        Peers {
            idle: Mutex::new(BTreeMap::new()),
            connect,
        }
    }

    /// An idle connection that is still open and was not idle too long, or a new one.
    async fn connection(&self, address: &str) -> Result<PeerSender, String> {
        loop {
            let idle = lock(&self.idle).get_mut(address).and_then(Vec::pop);
            match idle {
                Some((mut sender, since)) => {
                    if since.elapsed() < PEER_IDLE_REUSE && sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => return (self.connect)(address.to_string()).await,
            }
        }
    }

    /// Sends one request to `address` and reads the whole answer.
    pub async fn send(
        &self,
        address: &str,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Bytes>, String> {
        let mut sender = self.connection(address).await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request to {address}: {e}"))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("answer from {address}: {e}"))?
            .to_bytes();
        if !sender.is_closed() {
            let mut idle = lock(&self.idle);
            let list = idle.entry(address.to_string()).or_default();
            // The stale ones (the oldest, at the front) go; dropping one closes it.
            list.retain(|(_, since)| since.elapsed() < PEER_IDLE_REUSE);
            if list.len() < IDLE_PER_PEER {
                list.push((sender, tokio::time::Instant::now()));
            }
        }
        Ok(Response::from_parts(parts, body))
    }
}
