//! The routes: one file per surface, each a thin layer that parses a request, calls the broker
//! (or the admin views) and renders the answer. This file is the route table.

mod ack;
mod admin;
mod ephemeral;
mod groups;
mod kv;
mod locks;
mod pop;
mod push;
mod queues;
mod reads;
mod streams;
mod system;
mod timers;
mod transaction;

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use queen_core::params::PopShape;

use crate::broker::Broker;
use crate::http::auth::Access::{Admin, ReadOnly, ReadWrite};
use crate::http::auth::Caller;
use crate::http::deadline::WorkDeadline;
use crate::http::{self, Failure, Routed};
use crate::metrics;

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

/// The surface a path belongs to, for the storage-error metric's `route` label (a fixed set, so
/// a client cannot grow the metric's label space).
pub(crate) fn surface(path: &str) -> &'static str {
    let mut parts = path.split('/').filter(|s| !s.is_empty());
    let first = parts.next().unwrap_or("");
    let second = if first == "api" {
        parts.nth(1).unwrap_or("")
    } else {
        first
    };
    match second {
        "push" => "push",
        "pop" => "pop",
        "ack" | "lease" => "ack",
        "transaction" => "transaction",
        "kv" => "kv",
        "locks" => "locks",
        "timers" => "timers",
        "ephemeral" => "ephemeral",
        "fetch" | "partitions" => "reads",
        "streams" => "streams",
        "configure" => "configure",
        "dlq" | "consumer-groups" => "groups",
        "resources" | "messages" | "traces" | "status" | "analytics" | "stats" | "system" => {
            "admin"
        }
        "health" | "metrics" => "health",
        _ => "other",
    }
}

/// The route table: one `match` over the decoded path segments. A router crate would add a
/// dependency and a second table for what this match says in one place, with each route's
/// parameters bound by name.
pub(crate) async fn route(broker: Arc<Broker>, req: Request<Incoming>) -> Result<Routed, Failure> {
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
    let caller = match &broker.config.auth {
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
            Ok(system::health(&broker).await)
        }
        (&Method::GET, ["metrics"]) => need(ReadOnly)
            .map(|()| http::json(StatusCode::OK, &system::metrics_snapshot(&broker).json())),
        (&Method::GET, ["metrics", "prometheus"]) => {
            need(ReadOnly)?;
            admin::refresh_stored_metrics(&broker).await;
            Ok(http::text(
                StatusCode::OK,
                system::metrics_snapshot(&broker)
                    .prometheus()
                    .map_err(|e| Failure::server(format!("encoding the metrics: {e}")))?,
                metrics::OPENMETRICS_CONTENT_TYPE,
            ))
        }
        (&Method::POST, ["api", "v1", "push"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            push::push(&broker, &b, caller.producer()).await
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
            return pop::start(broker.clone(), shape, query.as_deref());
        }
        (&Method::GET, ["api", "v1", "pop", "queue", q]) => {
            need(ReadWrite)?;
            let shape = PopShape::Queue {
                queue: q.to_string(),
            };
            // A long-poll may park for minutes: its request (and the read buffer its header
            // bytes share) is not kept for it.
            drop(req);
            return pop::start(broker.clone(), shape, query.as_deref());
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
            return pop::start(broker.clone(), shape, query.as_deref());
        }
        (&Method::POST, ["api", "v1", "ack"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            ack::ack(&broker, &b).await
        }
        (&Method::POST, ["api", "v1", "ack", "batch"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            ack::ack_batch(&broker, &b).await
        }
        (&Method::POST, ["api", "v1", "lease", id, "extend"]) => {
            need(ReadWrite)?;
            let id = id.to_string();
            let b = body(&broker, req).await?;
            ack::extend_lease(&broker, &id, &b).await
        }
        (&Method::POST, ["api", "v1", "configure"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            queues::configure(&broker, &b).await
        }
        (&Method::DELETE, ["api", "v1", "resources", "queues", q]) => {
            need(Admin)?;
            let q = q.to_string();
            queues::delete_queue(&broker, &q).await
        }
        (&Method::POST, ["api", "v1", "kv"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            kv::batch(&broker, &b).await
        }
        (&Method::GET, ["api", "v1", "kv", ns, key @ ..]) if !key.is_empty() => {
            need(ReadOnly)?;
            kv::get(&broker, ns, &key.join("/"), req.headers()).await
        }
        (&Method::PUT, ["api", "v1", "kv", ns, key @ ..]) if !key.is_empty() => {
            need(ReadWrite)?;
            let (ns, key, headers) = (ns.to_string(), key.join("/"), req.headers().clone());
            let b = body(&broker, req).await?;
            kv::put(&broker, &ns, &key, query.as_deref(), &headers, &b).await
        }
        (&Method::DELETE, ["api", "v1", "kv", ns, key @ ..]) if !key.is_empty() => {
            need(ReadWrite)?;
            kv::delete(&broker, ns, &key.join("/"), req.headers()).await
        }
        (&Method::POST, ["api", "v1", "locks"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            locks::batch(&broker, &b).await
        }
        (&Method::POST, ["api", "v1", "fetch"]) => {
            need(ReadOnly)?;
            let b = body(&broker, req).await?;
            reads::fetch(&broker, &http::query_pairs(query.as_deref())?, &b).await
        }
        (&Method::POST, ["api", "v1", "partitions", "changed"]) => {
            need(ReadOnly)?;
            let b = body(&broker, req).await?;
            reads::changed(&broker, &b).await
        }
        (&Method::POST, ["streams", "v1", "queries"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            streams::register(&broker, &b).await
        }
        (&Method::POST, ["streams", "v1", "state", "get"]) => {
            need(ReadOnly)?;
            let b = body(&broker, req).await?;
            streams::state(&broker, &b).await
        }
        (&Method::POST, ["streams", "v1", "cycle"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            streams::cycle(&broker, &b, caller.producer()).await
        }
        (&Method::POST, ["api", "v1", "timers"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            timers::batch(&broker, &b).await
        }
        (&Method::GET, ["api", "v1", "timers", q]) => {
            need(ReadOnly)?;
            timers::list(&broker, q, query.as_deref()).await
        }
        (&Method::GET, ["api", "v1", "timers", q, key @ ..]) if !key.is_empty() => {
            need(ReadOnly)?;
            timers::peek(&broker, q, &key.join("/")).await
        }
        (&Method::DELETE, ["api", "v1", "timers", q, key @ ..]) if !key.is_empty() => {
            need(ReadWrite)?;
            timers::cancel(&broker, q, &key.join("/"), query.as_deref()).await
        }
        (_, ["api", "v1", "ephemeral", ..]) => {
            need(if method == Method::GET {
                ReadOnly
            } else {
                ReadWrite
            })?;
            let mut call = ephemeral::Call::of(&req);
            match (&method, &seg[3..]) {
                (&Method::GET, ["pop"]) => {
                    need(ReadWrite)?;
                    drop(req);
                    return ephemeral::pop(broker.clone(), call, query.as_deref()).await;
                }
                (&Method::GET, ["queues"]) => ephemeral::queues(&broker, &call).await,
                (&Method::GET, ["queues", q, "depth"]) => ephemeral::depth(&broker, &call, q).await,
                (&Method::DELETE, ["queue", q]) => ephemeral::delete(&broker, &call, q).await,
                (&Method::POST, [verb @ ("configure" | "reset" | "push" | "ack")]) => {
                    call.body = body(&broker, req).await?;
                    match *verb {
                        "configure" => ephemeral::configure(&broker, &call).await,
                        "reset" => ephemeral::reset(&broker, &call).await,
                        "push" => ephemeral::push(&broker, &call).await,
                        _ => ephemeral::ack(&broker, &call).await,
                    }
                }
                _ => Ok(http::json(
                    StatusCode::NOT_FOUND,
                    &serde_json::json!({"error": "no_such_route", "code": "no_such_route", "detail": format!("{method} {}", segments.join("/"))}),
                )),
            }
        }
        (&Method::POST, ["api", "v1", "transaction"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            transaction::transaction(&broker, &b, caller.producer()).await
        }
        (&Method::POST, ["api", "v1", "dlq", id, "requeue"]) => {
            need(ReadWrite)?;
            let id = id.to_string();
            groups::requeue(&broker, &id).await
        }
        (&Method::GET, ["api", "v1", "dlq"]) => {
            need(ReadOnly)?;
            groups::dead_letters(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::DELETE, ["api", "v1", "consumer-groups", g]) => {
            need(Admin)?;
            let g = g.to_string();
            groups::delete_group(&broker, &g, None, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::DELETE, ["api", "v1", "consumer-groups", g, "queues", q]) => {
            need(Admin)?;
            let (g, q) = (g.to_string(), q.to_string());
            groups::delete_group(&broker, &g, Some(&q), &http::query_pairs(query.as_deref())?).await
        }
        (&Method::POST, ["api", "v1", "consumer-groups", g, "queues", q, "seek"]) => {
            need(ReadWrite)?;
            let (g, q) = (g.to_string(), q.to_string());
            let b = body(&broker, req).await?;
            groups::seek(&broker, &g, &q, &b).await
        }
        (&Method::POST, ["api", "v1", "consumer-groups", g, "subscription"]) => {
            need(ReadWrite)?;
            let g = g.to_string();
            let b = body(&broker, req).await?;
            groups::update_subscription(&broker, &g, &b).await
        }
        (&Method::GET, ["api", "v1", "system", "maintenance"]) => {
            need(Admin)?;
            Ok(system::push_maintenance_state(&broker))
        }
        (&Method::POST, ["api", "v1", "system", "maintenance"]) => {
            need(Admin)?;
            let b = body(&broker, req).await?;
            system::set_push_maintenance(&broker, &b)
        }
        (&Method::GET, ["api", "v1", "system", "maintenance", "pop"]) => {
            need(Admin)?;
            Ok(system::pop_maintenance_state(&broker))
        }
        (&Method::POST, ["api", "v1", "system", "maintenance", "pop"]) => {
            need(Admin)?;
            let b = body(&broker, req).await?;
            system::set_pop_maintenance(&broker, &b)
        }
        (&Method::GET, ["api", "v1", "resources", "overview"]) => {
            need(ReadOnly)?;
            admin::overview(&broker).await
        }
        (&Method::GET, ["api", "v1", "resources", "namespaces"]) => {
            need(ReadOnly)?;
            admin::groupings(&broker, false).await
        }
        (&Method::GET, ["api", "v1", "resources", "tasks"]) => {
            need(ReadOnly)?;
            admin::groupings(&broker, true).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues"]) => {
            need(ReadOnly)?;
            admin::list_queues(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues", q]) => {
            need(ReadOnly)?;
            admin::get_queue(&broker, q, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "resources", "queues", q, "depth"]) => {
            need(ReadOnly)?;
            admin::queue_depth(&broker, q, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "resources", "partitions"]) => {
            need(ReadOnly)?;
            admin::list_partitions(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "messages"]) => {
            need(ReadOnly)?;
            admin::list_messages(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "messages", pid, tx]) => {
            need(ReadOnly)?;
            admin::get_message(&broker, pid, tx).await
        }
        (&Method::DELETE, ["api", "v1", "messages", pid, tx]) => {
            need(ReadWrite)?;
            admin::delete_message(&broker, pid, tx).await
        }
        (&Method::POST, ["api", "v1", "messages", pid, tx, "retry"]) => {
            need(ReadWrite)?;
            admin::retry_message(&broker, pid, tx).await
        }
        (&Method::POST, ["api", "v1", "traces"]) => {
            need(ReadWrite)?;
            let b = body(&broker, req).await?;
            admin::add_trace(&broker, &b).await
        }
        (&Method::GET, ["api", "v1", "traces", "names"]) => {
            need(ReadOnly)?;
            admin::trace_names(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "traces", "by-name", name]) => {
            need(ReadOnly)?;
            admin::traces_named(&broker, name, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "traces", pid, tx]) => {
            need(ReadOnly)?;
            admin::traces_of(&broker, pid, tx).await
        }
        (&Method::GET, ["api", "v1", "status"]) => {
            need(ReadOnly)?;
            admin::status(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "status", "queues"]) => {
            need(ReadOnly)?;
            admin::status_queues(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "status", "queues", q]) => {
            need(ReadOnly)?;
            admin::queue_detail(&broker, q, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "status", "analytics"]) => {
            need(ReadOnly)?;
            admin::analytics(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "analytics", "system-metrics"]) => {
            need(ReadOnly)?;
            admin::system_metrics(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "analytics", "worker-metrics"]) => {
            need(ReadOnly)?;
            admin::worker_metrics(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups"]) => {
            need(ReadOnly)?;
            admin::consumer_groups(&broker).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups", "lagging"]) => {
            need(ReadOnly)?;
            admin::lagging(&broker, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::GET, ["api", "v1", "consumer-groups", g]) => {
            need(ReadOnly)?;
            admin::consumer_group(&broker, g, &http::query_pairs(query.as_deref())?).await
        }
        (&Method::POST, ["api", "v1", "stats", "refresh"]) => {
            need(Admin)?;
            admin::refresh_stats(&broker).await
        }
        _ => Ok(http::json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "no_such_route", "code": "no_such_route", "detail": format!("{method} {}", segments.join("/"))}),
        )),
    };
    answered.map(Routed::Now)
}
