//! `queen-server`: the Queen broker over HTTP/1.1, wire-compatible with Queen's clients.

mod admin_routes;
pub mod app;
pub mod auth;
pub mod buffer;
pub mod config;
mod delivery_routes;
pub mod http;
pub mod metrics;
mod operations;
mod pop_route;
mod requests;
pub mod retention;
pub mod rounds;
mod routes;
pub mod sampler;
pub mod sealing;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use queen_core::params::PopShape;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::app::App;
use crate::auth::Access::{Admin, ReadOnly, ReadWrite};
use crate::auth::Caller;
use crate::http::{Failure, Reply};

/// The dashboard (one page: its data comes from the admin API, under the caller's token).
const DASHBOARD: &str = include_str!("../dashboard/index.html");

/// Answers one request. A panic anywhere below becomes a 500 for this request only.
///
/// The route's future lives on the heap only until it answers or hands back a pop's pending
/// reply: a long-poll parks for minutes, and its connection then holds this small future, not
/// the largest route's state machine (3.4 KiB of each parked connection, measured).
pub fn handle(app: Arc<App>, req: Request<Incoming>) -> impl Future<Output = Reply> + Send {
    let answering = Box::pin(answer(app, req));
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

/// A route's answer: a reply now, or one a pop's driver task sends when it has one.
pub(crate) enum Routed {
    Now(Reply),
    Later(tokio::sync::oneshot::Receiver<Reply>),
}

async fn answer(app: Arc<App>, req: Request<Incoming>) -> Routed {
    match AssertUnwindSafe(route(app.clone(), req))
        .catch_unwind()
        .await
    {
        Ok(Ok(routed)) => routed,
        Ok(Err(f)) => {
            let counter = if f.status.is_client_error() {
                &app.metrics.bad_requests
            } else {
                &app.metrics.server_errors
            };
            counter.inc();
            if f.status.is_server_error() {
                tracing::warn!(status = %f.status, error = %f.message, "request failed");
            }
            Routed::Now(http::error(&f))
        }
        Err(_) => {
            app.metrics.server_errors.inc();
            tracing::error!("request handler panicked");
            Routed::Now(http::error(&Failure::server("internal error")))
        }
    }
}

async fn body(app: &App, req: Request<Incoming>) -> Result<bytes::Bytes, Failure> {
    http::read_body(req.into_body(), app.config.max_body_bytes).await
}

/// The route table: one `match` over the decoded path segments. A router crate would add a
/// dependency and a second table for what this match says in one place, with each route's
/// parameters bound by name.
async fn route(app: Arc<App>, req: Request<Incoming>) -> Result<Routed, Failure> {
    let method = req.method().clone();
    let query = req.uri().query().map(str::to_string);
    let segments: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| http::percent_decode(s, false))
        .collect::<Result<_, _>>()?;
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    // A CORS preflight carries no credentials.
    if method == Method::OPTIONS {
        return Ok(Routed::Now(http::no_content()));
    }
    let caller = match &app.config.auth {
        None => Caller::Open,
        Some(auth) => auth.authenticate(req.uri().path(), req.headers()).await?,
    };
    // Each route states the level it requires (auth::Access); a public path's caller is Open.
    let need = |level| caller.require(level);
    let answered = match (&method, seg.as_slice()) {
        (&Method::GET, []) => {
            need(ReadOnly)?;
            Ok(http::text(
                StatusCode::OK,
                DASHBOARD.to_string(),
                "text/html; charset=utf-8",
            ))
        }
        (&Method::GET, ["health"]) => {
            need(ReadOnly)?;
            Ok(routes::health(&app).await)
        }
        (&Method::GET, ["metrics"]) => need(ReadOnly)
            .map(|()| http::json(StatusCode::OK, &routes::metrics_snapshot(&app).json())),
        (&Method::GET, ["metrics", "prometheus"]) => {
            need(ReadOnly)?;
            admin_routes::refresh_stored_metrics(&app).await;
            Ok(http::text(
                StatusCode::OK,
                routes::metrics_snapshot(&app)
                    .prometheus()
                    .map_err(|e| Failure::server(format!("encoding the metrics: {e}")))?,
                metrics::OPENMETRICS_CONTENT_TYPE,
            ))
        }
        (&Method::POST, ["api", "v1", "push"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            routes::push(&app, &b, caller.producer()).await
        }
        (&Method::GET, ["api", "v1", "pop", "queue", q, "partition", p]) => {
            need(ReadWrite)?;
            let shape = PopShape::Partition {
                queue: q.to_string(),
                partition: p.to_string(),
            };
            // A long-poll may park for minutes: its request (and the read buffer its header
            // bytes share) is not kept for it.
            drop(req);
            return Ok(pop_route::start(
                app.clone(),
                shape,
                http::query_pairs(query.as_deref())?,
            ));
        }
        (&Method::GET, ["api", "v1", "pop", "queue", q]) => {
            need(ReadWrite)?;
            let shape = PopShape::Queue {
                queue: q.to_string(),
            };
            // A long-poll may park for minutes: its request (and the read buffer its header
            // bytes share) is not kept for it.
            drop(req);
            return Ok(pop_route::start(
                app.clone(),
                shape,
                http::query_pairs(query.as_deref())?,
            ));
        }
        (&Method::GET, ["api", "v1", "pop"]) => {
            need(ReadWrite)?;
            let shape = PopShape::Discovery {
                namespace: None,
                task: None,
            };
            // A long-poll may park for minutes: its request (and the read buffer its header
            // bytes share) is not kept for it.
            drop(req);
            return Ok(pop_route::start(
                app.clone(),
                shape,
                http::query_pairs(query.as_deref())?,
            ));
        }
        (&Method::POST, ["api", "v1", "ack"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            routes::ack(&app, &b).await
        }
        (&Method::POST, ["api", "v1", "ack", "batch"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            routes::ack_batch(&app, &b).await
        }
        (&Method::POST, ["api", "v1", "lease", id, "extend"]) => {
            need(ReadWrite)?;
            let id = id.to_string();
            let b = body(&app, req).await?;
            routes::extend_lease(&app, &id, &b).await
        }
        (&Method::POST, ["api", "v1", "configure"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            routes::configure(&app, &b).await
        }
        (&Method::DELETE, ["api", "v1", "resources", "queues", q]) => {
            need(Admin)?;
            let q = q.to_string();
            routes::delete_queue(&app, &q).await
        }
        (&Method::POST, ["api", "v1", "transaction"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            delivery_routes::transaction(&app, &b, caller.producer()).await
        }
        (&Method::POST, ["api", "v1", "dlq", id, "requeue"]) => {
            need(ReadWrite)?;
            let id = id.to_string();
            delivery_routes::requeue(&app, &id).await
        }
        (&Method::GET, ["api", "v1", "dlq"]) => {
            need(ReadOnly)?;
            delivery_routes::dead_letters(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::DELETE, ["api", "v1", "consumer-groups", g]) => {
            need(Admin)?;
            let g = g.to_string();
            delivery_routes::delete_group(&app, &g, None, &http::query_pairs(query.as_deref())?)
                .await
        }
        (&Method::DELETE, ["api", "v1", "consumer-groups", g, "queues", q]) => {
            need(Admin)?;
            let (g, q) = (g.to_string(), q.to_string());
            delivery_routes::delete_group(&app, &g, Some(&q), &http::query_pairs(query.as_deref())?)
                .await
        }
        (&Method::POST, ["api", "v1", "consumer-groups", g, "queues", q, "seek"]) => {
            need(ReadWrite)?;
            let (g, q) = (g.to_string(), q.to_string());
            let b = body(&app, req).await?;
            delivery_routes::seek(&app, &g, &q, &b).await
        }
        (&Method::POST, ["api", "v1", "consumer-groups", g, "subscription"]) => {
            need(ReadWrite)?;
            let g = g.to_string();
            let b = body(&app, req).await?;
            delivery_routes::update_subscription(&app, &g, &b).await
        }
        (&Method::GET, ["api", "v1", "system", "maintenance"]) => {
            need(Admin)?;
            Ok(routes::push_maintenance_state(&app))
        }
        (&Method::POST, ["api", "v1", "system", "maintenance"]) => {
            need(Admin)?;
            let b = body(&app, req).await?;
            routes::set_push_maintenance(&app, &b)
        }
        (&Method::GET, ["api", "v1", "system", "maintenance", "pop"]) => {
            need(Admin)?;
            Ok(routes::pop_maintenance_state(&app))
        }
        (&Method::POST, ["api", "v1", "system", "maintenance", "pop"]) => {
            need(Admin)?;
            let b = body(&app, req).await?;
            routes::set_pop_maintenance(&app, &b)
        }
        (&Method::GET, ["api", "v1", "resources", "overview"]) => {
            need(ReadOnly)?;
            admin_routes::overview(&app).await
        }
        (&Method::GET, ["api", "v1", "resources", "namespaces"]) => {
            need(ReadOnly)?;
            admin_routes::groupings(&app, false).await
        }
        (&Method::GET, ["api", "v1", "resources", "tasks"]) => {
            need(ReadOnly)?;
            admin_routes::groupings(&app, true).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues"]) => {
            need(ReadOnly)?;
            admin_routes::list_queues(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues", q]) => {
            need(ReadOnly)?;
            admin_routes::get_queue(&app, q).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues", q, "depth"]) => {
            need(ReadOnly)?;
            admin_routes::queue_depth(&app, q, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "resources", "partitions"]) => {
            need(ReadOnly)?;
            admin_routes::list_partitions(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "messages"]) => {
            need(ReadOnly)?;
            admin_routes::list_messages(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "messages", pid, tx]) => {
            need(ReadOnly)?;
            admin_routes::get_message(&app, pid, tx).await
        }
        (&Method::DELETE, ["api", "v1", "messages", pid, tx]) => {
            need(ReadWrite)?;
            admin_routes::delete_message(&app, pid, tx).await
        }
        (&Method::POST, ["api", "v1", "messages", pid, tx, "retry"]) => {
            need(ReadWrite)?;
            admin_routes::retry_message(&app, pid, tx).await
        }
        (&Method::POST, ["api", "v1", "traces"]) => {
            need(ReadWrite)?;
            let b = body(&app, req).await?;
            admin_routes::add_trace(&app, &b).await
        }
        (&Method::GET, ["api", "v1", "traces", "names"]) => {
            need(ReadOnly)?;
            admin_routes::trace_names(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "traces", "by-name", name]) => {
            need(ReadOnly)?;
            admin_routes::traces_named(&app, name, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "traces", pid, tx]) => {
            need(ReadOnly)?;
            admin_routes::traces_of(&app, pid, tx).await
        }
        (&Method::GET, ["api", "v1", "status"]) => {
            need(ReadOnly)?;
            admin_routes::status(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "status", "queues"]) => {
            need(ReadOnly)?;
            admin_routes::status_queues(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "status", "queues", q]) => {
            need(ReadOnly)?;
            admin_routes::queue_detail(&app, q).await
        }
        (&Method::GET, ["api", "v1", "status", "analytics"]) => {
            need(ReadOnly)?;
            admin_routes::analytics(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "analytics", "system-metrics"]) => {
            need(ReadOnly)?;
            admin_routes::system_metrics(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "analytics", "worker-metrics"]) => {
            need(ReadOnly)?;
            admin_routes::worker_metrics(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups"]) => {
            need(ReadOnly)?;
            admin_routes::consumer_groups(&app).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups", "lagging"]) => {
            need(ReadOnly)?;
            admin_routes::lagging(&app, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups", g]) => {
            need(ReadOnly)?;
            admin_routes::consumer_group(&app, g).await
        }
        (&Method::POST, ["api", "v1", "stats", "refresh"]) => {
            need(Admin)?;
            admin_routes::refresh_stats()
        }
        _ => Ok(http::json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "no_such_route", "code": "no_such_route", "detail": format!("{method} {}", segments.join("/"))}),
        )),
    };
    answered.map(Routed::Now)
}

/// Serves HTTP/1.1 on one connection (any byte stream: a TCP socket, or turmoil's in tests).
/// When the app starts shutting down, the connection finishes its in-flight request and closes.
pub async fn serve_connection<IO>(app: Arc<App>, io: IO) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut shutdown = app.shutting_down.subscribe();
    let svc = service_fn(move |req| {
        // Boxed: hyper keeps the service's future inline in every connection, so an idle
        // keep-alive connection would carry the largest route's state machine.
        let reply = handle(app.clone(), req);
        Box::pin(async move { Ok::<_, std::convert::Infallible>(reply.await) })
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        biased;
        r = conn.as_mut() => return r,
        _ = shutdown.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    conn.await
}

/// Accepts connections until the app shuts down (no signal handling: tests and embedders).
pub async fn serve_listener(app: Arc<App>, listener: tokio::net::TcpListener) {
    let mut shutdown = app.shutting_down.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(app.clone(), stream));
            }
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// Feeds the deliverability events committed through any broker on the same PostgreSQL (LISTEN
/// queen_push and queen_event) into this broker's one event path, so parked consumers wake at
/// once, not at the next reseed. A (re)connected listener publishes a `Resync` first.
pub fn spawn_event_listener(
    app: Arc<App>,
    pg: &queen_storage_pg::PgStorage,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(pg.listen_events(tx));
    tokio::spawn(forward_events(app, rx))
}

/// Publishes every event from another broker (or storage's echo of this one's: applying an
/// event twice costs one extra look, never a wrong answer).
pub async fn forward_events(
    app: Arc<App>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<queen_core::events::DeliveryEvent>,
) {
    while let Some(event) = events.recv().await {
        app.publish(&event);
    }
}
