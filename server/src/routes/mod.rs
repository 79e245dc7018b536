//! The routes: one file per surface, each a thin layer that parses a request, calls the broker
//! (or the admin views) and renders the answer. This file is the route table: each route is
//! declared once (`ROUTES`), with its method, path pattern, required access level, metric
//! surface and handler; the storage-error metric's label, the auth matrix test and
//! docs/operations.md's route list are derived from it or checked against it.

mod ack;
mod admin;
mod ephemeral;
mod groups;
mod kv;
mod locks;
mod path;
mod pop;
mod push;
mod queues;
mod reads;
mod streams;
mod system;
mod timers;
mod transaction;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, StatusCode};
use queen_core::params::PopShape;

use crate::broker::Broker;
use crate::http::auth::Access::{self, Admin, ReadOnly, ReadWrite};
use crate::http::auth::Caller;
use crate::http::deadline::WorkDeadline;
use crate::http::{self, Failure, Reply, Routed};
use crate::metrics;

pub use path::Verb;

/// The dashboard (one page: its data comes from the admin API, under the caller's token).
const DASHBOARD: &str = include_str!("../../dashboard/index.html");

/// The request's body; its storage deadline (`WorkDeadline`) counts from its end.
async fn body(broker: &Broker, req: Request<Incoming>) -> Result<bytes::Bytes, Failure> {
    let deadline = req.extensions().get::<WorkDeadline>().cloned();
    if let Some(d) = &deadline {
        d.body_started();
    }
    let read = http::read_body(
        req.into_body(),
        broker.config.max_body_bytes,
        broker.config.client_idle_timeout(),
    )
    .await;
    if let Some(d) = &deadline {
        d.body_ended();
    }
    read
}

/// A request matched to a route: its parameters (in the pattern's order), its query, its caller.
pub(crate) struct Matched {
    broker: Arc<Broker>,
    /// `None` once the body was read.
    req: Option<Request<Incoming>>,
    params: Vec<String>,
    query: Option<String>,
    caller: Caller,
}

impl Matched {
    /// The `i`-th `{name}` of the pattern (a `{name*}` is its segments joined by `/`).
    fn param(&self, i: usize) -> &str {
        self.params.get(i).map_or("", String::as_str)
    }

    fn pairs(&self) -> Result<Vec<(String, String)>, Failure> {
        http::query_pairs(self.query.as_deref())
    }

    fn headers(&self) -> Result<&HeaderMap, Failure> {
        self.req
            .as_ref()
            .map(Request::headers)
            .ok_or_else(|| Failure::server("the request was read already"))
    }

    async fn body(&mut self) -> Result<bytes::Bytes, Failure> {
        let req = self
            .req
            .take()
            .ok_or_else(|| Failure::server("the request body was read already"))?;
        body(&self.broker, req).await
    }

    /// Lets the request go: a long-poll may park for minutes, and its request (with the read
    /// buffer its header bytes share) is not kept for it.
    fn release_request(&mut self) {
        self.req = None;
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Routed, Failure>> + Send>>;

/// One route: declared once, here.
pub struct Route {
    pub verb: Verb,
    /// Segments separated by `/`: a literal, `{name}` (one segment) or a last `{name*}` (one or
    /// more segments, joined by `/`).
    pub pattern: &'static str,
    pub access: Access,
    /// The storage-error metric's `route` label (a fixed set, so a client cannot grow it).
    pub surface: &'static str,
    handler: fn(Matched) -> Answer,
}

/// Declares routes: `VERB "pattern" Level "surface" => |m| now { .. }` for a handler that
/// answers a `Reply`, `=> |m| routed { .. }` for one that answers `Routed` (a pop's pending
/// reply).
macro_rules! routes {
    ($($verb:ident $pattern:literal $access:ident $surface:literal => |$m:ident| $kind:ident $body:block),* $(,)?) => {
        &[$(Route {
            verb: Verb::$verb,
            pattern: $pattern,
            access: $access,
            surface: $surface,
            handler: |#[allow(unused_mut)] mut $m: Matched| -> Answer {
                Box::pin(async move { routes!(@answer $kind $body) })
            },
        }),*]
    };
    (@answer now $body:block) => {{
        let reply: Result<Reply, Failure> = $body;
        reply.map(Routed::Now)
    }};
    (@answer routed $body:block) => { $body };
}

/// Every route, in the order they are tried: a literal segment before a `{name}` in the same
/// place (`/consumer-groups/lagging` before `/consumer-groups/{group}`).
pub static ROUTES: &[Route] = routes![
    GET "/" ReadOnly "health" => |_m| now {
        Ok(http::text(StatusCode::OK, DASHBOARD.to_string(), "text/html; charset=utf-8"))
    },
    GET "/health" ReadOnly "health" => |m| now { Ok(system::health(&m.broker).await) },
    GET "/metrics" ReadOnly "health" => |m| now {
        Ok(http::json(StatusCode::OK, &system::metrics_snapshot(&m.broker).json()))
    },
    GET "/metrics/prometheus" ReadOnly "health" => |m| now {
        admin::refresh_stored_metrics(&m.broker).await;
        let text = system::metrics_snapshot(&m.broker)
            .prometheus()
            .map_err(|e| Failure::server(format!("encoding the metrics: {e}")))?;
        Ok(http::text(StatusCode::OK, text, metrics::OPENMETRICS_CONTENT_TYPE))
    },
    POST "/api/v1/push" ReadWrite "push" => |m| now {
        let b = m.body().await?;
        push::push(&m.broker, &b, m.caller.producer()).await
    },
    GET "/api/v1/pop/queue/{queue}/partition/{partition}" ReadWrite "pop" => |m| routed {
        let shape = PopShape::Partition {
            queue: m.param(0).to_string(),
            partition: m.param(1).to_string(),
        };
        m.release_request();
        pop::start(m.broker.clone(), shape, m.query.as_deref())
    },
    GET "/api/v1/pop/queue/{queue}" ReadWrite "pop" => |m| routed {
        let shape = PopShape::Queue { queue: m.param(0).to_string() };
        m.release_request();
        pop::start(m.broker.clone(), shape, m.query.as_deref())
    },
    GET "/api/v1/pop" ReadWrite "pop" => |m| routed {
        let shape = PopShape::Discovery { namespace: None, task: None };
        m.release_request();
        pop::start(m.broker.clone(), shape, m.query.as_deref())
    },
    POST "/api/v1/ack" ReadWrite "ack" => |m| now {
        let b = m.body().await?;
        ack::ack(&m.broker, &b).await
    },
    POST "/api/v1/ack/batch" ReadWrite "ack" => |m| now {
        let b = m.body().await?;
        ack::ack_batch(&m.broker, &b).await
    },
    POST "/api/v1/lease/{leaseId}/extend" ReadWrite "ack" => |m| now {
        let b = m.body().await?;
        ack::extend_lease(&m.broker, m.param(0), &b).await
    },
    POST "/api/v1/transaction" ReadWrite "transaction" => |m| now {
        let b = m.body().await?;
        transaction::transaction(&m.broker, &b, m.caller.producer()).await
    },
    POST "/api/v1/configure" ReadWrite "configure" => |m| now {
        let b = m.body().await?;
        queues::configure(&m.broker, &b).await
    },
    DELETE "/api/v1/resources/queues/{queue}" Admin "admin" => |m| now {
        queues::delete_queue(&m.broker, m.param(0)).await
    },
    POST "/api/v1/kv" ReadWrite "kv" => |m| now {
        let b = m.body().await?;
        kv::batch(&m.broker, &b).await
    },
    GET "/api/v1/kv/{ns}/{key*}" ReadOnly "kv" => |m| now {
        kv::get(&m.broker, m.param(0), m.param(1), m.headers()?).await
    },
    PUT "/api/v1/kv/{ns}/{key*}" ReadWrite "kv" => |m| now {
        let headers = m.headers()?.clone();
        let b = m.body().await?;
        kv::put(&m.broker, m.param(0), m.param(1), m.query.as_deref(), &headers, &b).await
    },
    DELETE "/api/v1/kv/{ns}/{key*}" ReadWrite "kv" => |m| now {
        kv::delete(&m.broker, m.param(0), m.param(1), m.headers()?).await
    },
    POST "/api/v1/locks" ReadWrite "locks" => |m| now {
        let b = m.body().await?;
        locks::batch(&m.broker, &b).await
    },
    POST "/api/v1/timers" ReadWrite "timers" => |m| now {
        let b = m.body().await?;
        timers::batch(&m.broker, &b).await
    },
    GET "/api/v1/timers/{queue}" ReadOnly "timers" => |m| now {
        timers::list(&m.broker, m.param(0), m.query.as_deref()).await
    },
    GET "/api/v1/timers/{queue}/{timerKey*}" ReadOnly "timers" => |m| now {
        timers::peek(&m.broker, m.param(0), m.param(1)).await
    },
    DELETE "/api/v1/timers/{queue}/{timerKey*}" ReadWrite "timers" => |m| now {
        timers::cancel(&m.broker, m.param(0), m.param(1), m.query.as_deref()).await
    },
    POST "/api/v1/fetch" ReadOnly "reads" => |m| now {
        let b = m.body().await?;
        reads::fetch(&m.broker, &m.pairs()?, &b).await
    },
    POST "/api/v1/partitions/changed" ReadOnly "reads" => |m| now {
        let b = m.body().await?;
        reads::changed(&m.broker, &b).await
    },
    POST "/streams/v1/queries" ReadWrite "streams" => |m| now {
        let b = m.body().await?;
        streams::register(&m.broker, &b).await
    },
    POST "/streams/v1/state/get" ReadOnly "streams" => |m| now {
        let b = m.body().await?;
        streams::state(&m.broker, &b).await
    },
    POST "/streams/v1/cycle" ReadWrite "streams" => |m| now {
        let b = m.body().await?;
        streams::cycle(&m.broker, &b, m.caller.producer()).await
    },
    GET "/api/v1/ephemeral/pop" ReadWrite "ephemeral" => |m| routed {
        let call = m.ephemeral_call().await?;
        m.release_request();
        ephemeral::pop(m.broker.clone(), call, m.query.as_deref()).await
    },
    GET "/api/v1/ephemeral/queues" ReadOnly "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::queues(&m.broker, &call).await
    },
    GET "/api/v1/ephemeral/queues/{queue}/depth" ReadOnly "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::depth(&m.broker, &call, m.param(0)).await
    },
    DELETE "/api/v1/ephemeral/queue/{queue}" ReadWrite "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::delete(&m.broker, &call, m.param(0)).await
    },
    POST "/api/v1/ephemeral/configure" ReadWrite "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::configure(&m.broker, &call).await
    },
    POST "/api/v1/ephemeral/reset" ReadWrite "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::reset(&m.broker, &call).await
    },
    POST "/api/v1/ephemeral/push" ReadWrite "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::push(&m.broker, &call).await
    },
    POST "/api/v1/ephemeral/ack" ReadWrite "ephemeral" => |m| now {
        let call = m.ephemeral_call().await?;
        ephemeral::ack(&m.broker, &call).await
    },
    POST "/api/v1/dlq/{id}/requeue" ReadWrite "groups" => |m| now {
        groups::requeue(&m.broker, m.param(0)).await
    },
    GET "/api/v1/dlq" ReadOnly "groups" => |m| now {
        groups::dead_letters(&m.broker, &m.pairs()?).await
    },
    DELETE "/api/v1/consumer-groups/{group}" Admin "groups" => |m| now {
        groups::delete_group(&m.broker, m.param(0), None, &m.pairs()?).await
    },
    DELETE "/api/v1/consumer-groups/{group}/queues/{queue}" Admin "groups" => |m| now {
        groups::delete_group(&m.broker, m.param(0), Some(m.param(1)), &m.pairs()?).await
    },
    POST "/api/v1/consumer-groups/{group}/queues/{queue}/seek" ReadWrite "groups" => |m| now {
        let b = m.body().await?;
        groups::seek(&m.broker, m.param(0), m.param(1), &b).await
    },
    POST "/api/v1/consumer-groups/{group}/subscription" ReadWrite "groups" => |m| now {
        let b = m.body().await?;
        groups::update_subscription(&m.broker, m.param(0), &b).await
    },
    GET "/api/v1/system/maintenance" Admin "admin" => |m| now {
        Ok(system::push_maintenance_state(&m.broker))
    },
    POST "/api/v1/system/maintenance" Admin "admin" => |m| now {
        let b = m.body().await?;
        system::set_push_maintenance(&m.broker, &b)
    },
    GET "/api/v1/system/maintenance/pop" Admin "admin" => |m| now {
        Ok(system::pop_maintenance_state(&m.broker))
    },
    POST "/api/v1/system/maintenance/pop" Admin "admin" => |m| now {
        let b = m.body().await?;
        system::set_pop_maintenance(&m.broker, &b)
    },
    GET "/api/v1/resources/overview" ReadOnly "admin" => |m| now { admin::overview(&m.broker).await },
    GET "/api/v1/resources/namespaces" ReadOnly "admin" => |m| now {
        admin::groupings(&m.broker, false).await
    },
    GET "/api/v1/resources/tasks" ReadOnly "admin" => |m| now { admin::groupings(&m.broker, true).await },
    GET "/api/v1/resources/queues" ReadOnly "admin" => |m| now {
        admin::list_queues(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/resources/queues/{queue}" ReadOnly "admin" => |m| now {
        admin::get_queue(&m.broker, m.param(0), &m.pairs()?).await
    },
    GET "/api/v1/resources/queues/{queue}/depth" ReadOnly "admin" => |m| now {
        admin::queue_depth(&m.broker, m.param(0), &m.pairs()?).await
    },
    GET "/api/v1/resources/partitions" ReadOnly "admin" => |m| now {
        admin::list_partitions(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/messages" ReadOnly "admin" => |m| now {
        admin::list_messages(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/messages/{partitionId}/{transactionId}" ReadOnly "admin" => |m| now {
        admin::get_message(&m.broker, m.param(0), m.param(1)).await
    },
    DELETE "/api/v1/messages/{partitionId}/{transactionId}" ReadWrite "admin" => |m| now {
        admin::delete_message(&m.broker, m.param(0), m.param(1)).await
    },
    POST "/api/v1/messages/{partitionId}/{transactionId}/retry" ReadWrite "admin" => |m| now {
        admin::retry_message(&m.broker, m.param(0), m.param(1)).await
    },
    POST "/api/v1/traces" ReadWrite "admin" => |m| now {
        let b = m.body().await?;
        admin::add_trace(&m.broker, &b).await
    },
    GET "/api/v1/traces/names" ReadOnly "admin" => |m| now {
        admin::trace_names(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/traces/by-name/{name}" ReadOnly "admin" => |m| now {
        admin::traces_named(&m.broker, m.param(0), &m.pairs()?).await
    },
    GET "/api/v1/traces/{partitionId}/{transactionId}" ReadOnly "admin" => |m| now {
        admin::traces_of(&m.broker, m.param(0), m.param(1)).await
    },
    GET "/api/v1/status" ReadOnly "admin" => |m| now { admin::status(&m.broker, &m.pairs()?).await },
    GET "/api/v1/status/queues" ReadOnly "admin" => |m| now {
        admin::status_queues(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/status/queues/{queue}" ReadOnly "admin" => |m| now {
        admin::queue_detail(&m.broker, m.param(0), &m.pairs()?).await
    },
    GET "/api/v1/status/analytics" ReadOnly "admin" => |m| now {
        admin::analytics(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/analytics/system-metrics" ReadOnly "admin" => |m| now {
        admin::system_metrics(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/analytics/worker-metrics" ReadOnly "admin" => |m| now {
        admin::worker_metrics(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/consumer-groups" ReadOnly "groups" => |m| now {
        admin::consumer_groups(&m.broker).await
    },
    GET "/api/v1/consumer-groups/lagging" ReadOnly "groups" => |m| now {
        admin::lagging(&m.broker, &m.pairs()?).await
    },
    GET "/api/v1/consumer-groups/{group}" ReadOnly "groups" => |m| now {
        admin::consumer_group(&m.broker, m.param(0), &m.pairs()?).await
    },
    POST "/api/v1/stats/refresh" Admin "admin" => |m| now { admin::refresh_stats(&m.broker).await },
];

impl Matched {
    /// An ephemeral call (forwarded to the queue's owner when this broker is not it), with the
    /// request's body.
    async fn ephemeral_call(&mut self) -> Result<ephemeral::Call, Failure> {
        let mut call = ephemeral::Call::of(
            self.req
                .as_ref()
                .ok_or_else(|| Failure::server("the request was read already"))?,
        );
        if matches!(self.req.as_ref().map(Request::method), Some(&Method::POST)) {
            call.body = self.body().await?;
        }
        Ok(call)
    }
}

/// The route a method and decoded path segments name, with its parameters.
pub fn find(method: &Method, segments: &[&str]) -> Option<(&'static Route, Vec<String>)> {
    let verb = Verb::of(method)?;
    ROUTES.iter().find_map(|r| {
        (r.verb == verb)
            .then(|| path::matches(r.pattern, segments))
            .flatten()
            .map(|params| (r, params))
    })
}

/// The surface of a request, for the storage-error metric's label: its route's, or "other".
pub(crate) fn surface(method: &Method, path: &str) -> &'static str {
    let segments: Vec<String> = match path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| http::percent_decode(s, false))
        .collect::<Result<_, _>>()
    {
        Ok(s) => s,
        Err(_) => return "other",
    };
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    find(method, &seg).map_or("other", |(r, _)| r.surface)
}

/// Routes a request: authenticates it, finds its route, checks the route's level, runs it.
pub(crate) async fn route(broker: Arc<Broker>, req: Request<Incoming>) -> Result<Routed, Failure> {
    // A CORS preflight carries no credentials.
    if req.method() == Method::OPTIONS {
        return Ok(Routed::Now(http::no_content()));
    }
    let segments: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| http::percent_decode(s, false))
        .collect::<Result<_, _>>()?;
    let caller = match &broker.config.auth {
        None => Caller::Open,
        Some(auth) => auth.authenticate(req.uri().path(), req.headers()).await?,
    };
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let Some((route, params)) = find(req.method(), &seg) else {
        return Ok(Routed::Now(http::json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "no_such_route", "code": "no_such_route", "detail": format!("{} {}", req.method(), segments.join("/"))}),
        )));
    };
    caller.require(route.access)?;
    let query = req.uri().query().map(str::to_string);
    (route.handler)(Matched {
        broker,
        req: Some(req),
        params,
        query,
        caller,
    })
    .await
}
