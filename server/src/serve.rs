//! Serving HTTP/1.1: connections, the listener, and the one place a request becomes a reply
//! (a panic below becomes a 500 for that request only).

use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::broker::{past_storage_deadline, Broker};
use crate::http::deadline::WorkDeadline;
use crate::http::{self, Failure, Reply, Routed};
use crate::routes::{route, surface};

/// Answers one request. A panic anywhere below becomes a 500 for this request only.
///
/// The route's future lives on the heap only until it answers or hands back a pop's pending
/// reply: a long-poll parks for minutes, and its connection then holds this small future, not
/// the largest route's state machine (3.4 KiB of each parked connection, measured).
pub fn handle(broker: Arc<Broker>, req: Request<Incoming>) -> impl Future<Output = Reply> + Send {
    let answering = Box::pin(answer(broker, req));
    async move {
        match answering.await {
            Routed::Now(reply) => reply,
            Routed::Later(pending) => pending.await.unwrap_or_else(|_| {
                // The pop's driver task ended without answering: only a panic does that.
                http::error(&Failure::server("pop failed unexpectedly"))
            }),
        }
    }
}

async fn answer(broker: Arc<Broker>, mut req: Request<Incoming>) -> Routed {
    // For the storage-error metric's label, found only when a storage error needs it.
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let limit = broker.config.storage_deadline();
    let deadline = WorkDeadline::new(limit);
    req.extensions_mut().insert(deadline.clone());
    // A pop hands back its pending reply at once (its driver has storage deadlines of its own),
    // so the deadline bounds every route's own work, never a long-poll's parking.
    let routing = AssertUnwindSafe(route(broker.clone(), req)).catch_unwind();
    // Biased, as `timeout` polls: the route first (an unbiased select draws its order from
    // tokio's unseeded RNG, and the simulation replays a seed exactly).
    let routed = tokio::select! {
        biased;
        routed = routing => routed,
        () = deadline.passed() => Ok(Err(Failure::from(past_storage_deadline(limit)))),
    };
    match routed {
        Ok(Ok(routed)) => routed,
        Ok(Err(f)) => {
            let counter = if f.status.is_client_error() {
                &broker.metrics.bad_requests
            } else {
                &broker.metrics.server_errors
            };
            counter.inc();
            match &f.storage {
                Some(e) => {
                    broker.note_storage_error(surface(&method, uri.path()), e);
                }
                None if f.status.is_server_error() => {
                    tracing::warn!(status = %f.status, error = %f.message, "request failed");
                }
                None => {}
            }
            Routed::Now(http::error(&f))
        }
        Err(_) => {
            broker.metrics.server_errors.inc();
            tracing::error!("request handler panicked");
            Routed::Now(http::error(&Failure::server("internal error")))
        }
    }
}

/// Serves HTTP/1.1 on one connection (any byte stream: a TCP socket, or turmoil's in tests).
/// When the broker starts shutting down, the connection finishes its in-flight request and closes.
pub async fn serve_connection<IO>(broker: Arc<Broker>, io: IO) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut shutdown = broker.shutting_down.subscribe();
    let idle = broker.config.client_idle_timeout();
    let svc = service_fn(move |req| {
        // Boxed: hyper keeps the service's future inline in every connection, so an idle
        // keep-alive connection would carry the largest route's state machine.
        let reply = handle(broker.clone(), req);
        Box::pin(async move { Ok::<_, std::convert::Infallible>(reply.await) })
    });
    let mut builder = http1::Builder::new();
    builder.keep_alive(true);
    // A connection that owes the next request's head (new, or idle between requests) is closed
    // after the client-idle timeout: one that never sends a whole head, or whose peer vanished,
    // would otherwise hold its socket and buffers for ever. hyper's timer starts when it waits
    // for a head, so a long-poll waiting for its answer is never cut.
    if let Some(idle) = idle {
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(idle);
    }
    let io = WriteStallGuard {
        io,
        limit: idle,
        stalled: None,
    };
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        biased;
        r = conn.as_mut() => return r,
        _ = shutdown.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    conn.await
}

/// Accepts connections until the broker shuts down (no signal handling: tests and embedders).
pub async fn serve_listener(broker: Arc<Broker>, listener: tokio::net::TcpListener) {
    let mut shutdown = broker.shutting_down.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors, say: accepting again at once would spin.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(broker.clone(), stream));
    }
}

/// A connection's stream whose writes fail once they have made no progress for `limit`: a
/// client that stops reading its answer (a frozen process, a host gone without a word) would
/// otherwise hold the connection, and the answer's bytes, for ever. The timer runs only while a
/// write waits, so a parked long-poll, which writes nothing, is never cut.
struct WriteStallGuard<IO> {
    io: IO,
    limit: Option<std::time::Duration>,
    /// Armed when a write first waits; disarmed by any progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> WriteStallGuard<IO> {
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let Poll::Pending = polled else {
            self.stalled = None;
            return polled;
        };
        let Some(limit) = self.limit else {
            return Poll::Pending;
        };
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.stalled = None;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client read nothing of its answer for {} ms",
                limit.as_millis()
            ),
        )))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteStallGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteStallGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.guard(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.guard(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.guard(cx, polled)
    }
}
