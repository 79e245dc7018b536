//! Health, metrics and the maintenance switches.

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::helpers::lock;
use crate::http::{self, wire as requests, Failure, Reply};
use crate::metrics::Snapshot;
use crate::storage_reads;

fn push_maintenance_json(broker: &Broker) -> Value {
    let on = broker
        .push_maintenance
        .load(std::sync::atomic::Ordering::SeqCst);
    let buffer = broker.config.file_buffer.as_ref();
    json!({"maintenanceMode": on,
           "popMaintenanceMode": lock(&broker.pop_ctx).pop_maintenance,
           "bufferedMessages": buffer.map_or(0, |b| b.pending_messages()),
           "bufferHealthy": buffer.is_some(),
           "bufferStats": {"configured": buffer.is_some(),
                           "pendingPushes": buffer.map_or(0, |b| b.pending()),
                           "pendingMessages": buffer.map_or(0, |b| b.pending_messages()),
                           "dir": buffer.map(|b| b.dir().display().to_string())}})
}

/// GET /api/v1/system/maintenance: push maintenance mode and the file buffer.
pub fn push_maintenance_state(broker: &Broker) -> Reply {
    http::json(StatusCode::OK, &push_maintenance_json(broker))
}

/// POST /api/v1/system/maintenance {"enabled": bool}: while on, pushes go to the file buffer
/// (answered `buffered`) and are stored, in order, once it is switched off.
pub fn set_push_maintenance(broker: &Broker, body: &[u8]) -> Result<Reply, Failure> {
    let request: requests::MaintenanceBody = requests::body(body, None)?;
    if request.enabled && broker.config.file_buffer.is_none() {
        return Err(Failure {
            status: StatusCode::CONFLICT,
            message: "push maintenance mode needs a file buffer (FILE_BUFFER_DIR)".into(),
            storage: None,
            code: None,
        });
    }
    broker
        .push_maintenance
        .store(request.enabled, std::sync::atomic::Ordering::SeqCst);
    broker.drain_wake.notify_one();
    let mut answer = push_maintenance_json(broker);
    answer["message"] = json!(if request.enabled {
        "push maintenance is on: pushes are buffered"
    } else {
        "push maintenance is off: buffered pushes are being stored"
    });
    Ok(http::json(StatusCode::OK, &answer))
}

pub fn pop_maintenance_state(broker: &Broker) -> Reply {
    let on = lock(&broker.pop_ctx).pop_maintenance;
    http::json(
        StatusCode::OK,
        &json!({"popMaintenanceMode": on, "message": if on { "pop maintenance is on: pops answer empty" } else { "pop maintenance is off" }}),
    )
}

pub fn set_pop_maintenance(broker: &Broker, body: &[u8]) -> Result<Reply, Failure> {
    let request: requests::MaintenanceBody = requests::body(body, None)?;
    lock(&broker.pop_ctx).pop_maintenance = request.enabled;
    Ok(pop_maintenance_state(broker))
}

pub async fn health(broker: &Broker) -> Reply {
    let health = storage_reads::health(broker).await;
    let status = if health.reachable {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    http::json(
        status,
        &json!({"status": if health.reachable { "healthy" } else { "unhealthy" },
                "database": health.database, "version": env!("CARGO_PKG_VERSION")}),
    )
}

pub fn metrics_snapshot(broker: &Broker) -> Snapshot<'_> {
    let (limit, in_flight) = broker.limiter.state();
    let usage = storage_reads::usage(broker);
    Snapshot {
        metrics: &broker.metrics,
        limiter_limit: limit,
        limiter_in_flight: in_flight,
        pool_in_use: usage.pool_in_use,
        pool_size: usage.pool_size,
        backend: usage.backend,
    }
}
