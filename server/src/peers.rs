//! Requests to other brokers of the deployment (an ephemeral call forwarded to its queue's
//! owner): HTTP/1.1 over kept-alive connections, a few idle ones kept per peer. hyper's own
//! client connection, since the server already links hyper; a pooling client crate would add a
//! second HTTP stack for this one use.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::helpers::lock;

/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 16;

#[derive(Default)]
pub struct Peers {
    idle: Mutex<BTreeMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl Peers {
    async fn connect(address: &str) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connecting to {address}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {address}: {e}"))?;
        tokio::spawn(async move {
            // Ends when the peer or this side closes; nothing to report.
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// An idle connection that is still open, or a new one.
    async fn connection(&self, address: &str) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let idle = lock(&self.idle).get_mut(address).and_then(Vec::pop);
            match idle {
                Some(mut sender) => {
                    if sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => return Self::connect(address).await,
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
            if list.len() < IDLE_PER_PEER {
                list.push(sender);
            }
        }
        Ok(Response::from_parts(parts, body))
    }
}
