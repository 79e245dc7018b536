//! Messages: the listing across queues, one message, its deletion and its retry.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::StatusCode;
use queen_core::frames::{slice_blob, Frame};
use queen_core::storage::{PartitionView, QueueFilter, SegmentQuery, StoredMessage, StoredSegment};
use queen_core::types::QUEUE_MODE_GROUP;
use serde_json::{json, Value};

use super::{iso, name_param, not_found, ok, paging, param, time_param, Pairs};
use crate::broker::Broker;
use crate::http::wire as requests;
use crate::http::{self, Failure, Reply};
use crate::stats::Snapshot;
use crate::storage_reads;
use crate::tasks::admin_totals;
use crate::views::{message_status, page};

fn mode_json(groups: &[String]) -> Value {
    let has_queue_mode = groups.iter().any(|g| g == QUEUE_MODE_GROUP);
    let bus = groups.iter().filter(|g| *g != QUEUE_MODE_GROUP).count();
    let kind = match (has_queue_mode, bus > 0) {
        (true, true) => "hybrid",
        (true, false) => "queue",
        (false, true) => "bus",
        (false, false) => "none",
    };
    json!({"hasQueueMode": has_queue_mode, "busGroupsCount": bus, "type": kind})
}

fn frame_payload(broker: &Broker, f: &Frame) -> Result<(Value, bool), Failure> {
    let plain = crate::sealing::plaintext(broker.config.cipher.as_deref(), f);
    match plain {
        Ok(bytes) => Ok((
            serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            f.encrypted,
        )),
        // Sealed and this broker has no key: say so rather than fail the listing.
        Err(_) => Ok((Value::Null, true)),
    }
}

/// Segments read per listing page at most: a page of a sparse status filter stops there and
/// says so (`truncated`), rather than reading the whole log.
const MAX_SEGMENTS_PER_LISTING: u32 = 2000;

/// The listing's name filters: queue, partition, namespace (`ns` or `namespace`) and task.
struct ListingNames {
    queue: Option<String>,
    partition: Option<String>,
    namespace: Option<String>,
    task: Option<String>,
}

fn listing_names(pairs: &Pairs) -> Result<ListingNames, Failure> {
    let namespace = match name_param(pairs, "ns")? {
        Some(n) => Some(n),
        None => name_param(pairs, "namespace")?,
    };
    Ok(ListingNames {
        queue: name_param(pairs, "queue")?,
        partition: name_param(pairs, "partition")?,
        namespace,
        task: name_param(pairs, "task")?,
    })
}

/// The listing's status filter, one of the four statuses.
fn status_param(pairs: &Pairs) -> Result<Option<&str>, Failure> {
    let status = param(pairs, "status");
    if let Some(s) = status {
        if !["pending", "processing", "completed", "dead_letter"].contains(&s) {
            return Err(Failure::bad(
                "status must be pending, processing, completed or dead_letter",
            ));
        }
    }
    Ok(status)
}

/// What the message listing knows of a queue it lists: its configuration, the groups reading it
/// (the admin totals', with those on each message's partition added) and the offsets of its
/// newest 1000 dead letters, whose messages show as dead_letter.
struct ListedQueue {
    config: queen_core::storage::QueueConfig,
    groups: Vec<String>,
    dead: std::collections::BTreeSet<(String, i64)>,
}

/// The listing's view of queue `name`; `None` when it is gone or the filter leaves it out.
async fn listed_queue(
    broker: &Broker,
    snap: &Snapshot,
    name: &str,
    filter: &QueueFilter,
) -> Result<Option<ListedQueue>, Failure> {
    let Some(config) = storage_reads::queue_config(broker, name).await? else {
        return Ok(None);
    };
    if !filter.matches(&config) {
        return Ok(None);
    }
    let groups = snap
        .queue(name)
        .map_or_else(Vec::new, |t| t.view.groups.clone());
    let letters = broker
        .dead_letters(queen_core::storage::DlqQuery {
            queue: name.to_string(),
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let dead = letters
        .entries
        .into_iter()
        .map(|d| (d.partition_id, d.offset))
        .collect();
    Ok(Some(ListedQueue {
        config,
        groups,
        dead,
    }))
}

/// Where a listed message is: its segment, partition, queue and offset.
struct Place<'a> {
    segment: &'a StoredSegment,
    partition: &'a PartitionView,
    queue: &'a ListedQueue,
    offset: i64,
}

/// A row of the message listing in Queen's shape; `status` is `message_status`'s answer.
fn listed_message(
    broker: &Broker,
    at: &Place<'_>,
    f: &Frame,
    (st, consumed, group_count): (&str, u64, u64),
) -> Result<Value, Failure> {
    let (s, p, c) = (at.segment, at.partition, &at.queue.config);
    let (data, encrypted) = frame_payload(broker, f)?;
    let mut m = json!({
        "id": f.message_id.to_string(), "transactionId": f.transaction_id,
        "partitionId": s.partition_id, "queuePath": format!("{}/{}", s.queue, s.partition),
        "queue": s.queue, "partition": s.partition, "namespace": c.namespace,
        "task": c.task, "status": st, "queueStatus": st,
        "busStatus": {"consumedBy": consumed, "totalGroups": group_count},
        "traceId": f.trace_id.map(|t| t.to_string()), "producerSub": f.producer,
        "queuePriority": c.priority, "createdAt": iso(s.row.created_at),
        "leaseExpiresAt": p.cursor(QUEUE_MODE_GROUP).and_then(|c| c.leased_until).map(iso),
        "offset": at.offset,
    });
    m["data"] = data;
    m["isEncrypted"] = json!(encrypted);
    Ok(m)
}

/// GET /api/v1/messages[?queue,partition,ns|namespace,task,status,from,to,limit,offset]:
/// newest first. `from` defaults to an hour ago, as in Queen. It reads the segments of the
/// window newest first and, for each batch, the partitions and queues it has not seen yet.
pub async fn list_messages(broker: &Arc<Broker>, pairs: &Pairs) -> Result<Reply, Failure> {
    let (limit, offset) = paging(pairs, 200)?;
    let ListingNames {
        queue,
        partition,
        namespace,
        task,
    } = listing_names(pairs)?;
    let status = status_param(pairs)?;
    let now = broker.now();
    let from = time_param(pairs, "from")?.unwrap_or(now.minus_secs(3600));
    let to = time_param(pairs, "to")?;
    let filter = QueueFilter {
        queue: queue.clone(),
        namespace,
        task,
    };
    let snap = admin_totals::for_request(broker).await?;
    let mut queues: BTreeMap<String, Option<ListedQueue>> = BTreeMap::new();
    if let Some(q) = &queue {
        queues.insert(q.clone(), listed_queue(broker, &snap, q, &filter).await?);
    }
    let mut partitions: BTreeMap<String, PartitionView> = BTreeMap::new();
    let wanted = offset as usize + limit as usize;
    let mut matched: Vec<Value> = vec![];
    let mut after = None;
    let mut read = 0u32;
    let mut truncated = false;
    'segments: loop {
        let batch = storage_reads::segments(
            broker,
            SegmentQuery {
                queue: queue.clone(),
                partition: partition.clone(),
                from: Some(from),
                to,
                after: after.clone(),
                limit: 100,
            },
        )
        .await?;
        if batch.is_empty() {
            break;
        }
        let mut unseen: Vec<String> = batch
            .iter()
            .map(|s| s.partition_id.clone())
            .filter(|id| !partitions.contains_key(id))
            .collect();
        unseen.sort();
        unseen.dedup();
        if !unseen.is_empty() {
            for p in storage_reads::partition_views_by_id(broker, &unseen).await? {
                partitions.insert(p.partition_id.clone(), p);
            }
        }
        for s in &batch {
            if !queues.contains_key(&s.queue) {
                let listed = listed_queue(broker, &snap, &s.queue, &filter).await?;
                queues.insert(s.queue.clone(), listed);
            }
        }
        for s in &batch {
            read += 1;
            after = Some(s.mark());
            let (Some(p), Some(Some(q))) = (partitions.get(&s.partition_id), queues.get(&s.queue))
            else {
                continue;
            };
            let mut groups = q.groups.clone();
            for c in &p.cursors {
                if !groups.contains(&c.group) {
                    groups.push(c.group.clone());
                }
            }
            let frames = slice_blob(
                &s.row.blob,
                0,
                s.row.msg_count as usize,
                s.row.msg_count as usize,
            )
            .map_err(|e| Failure::server(format!("reading a stored segment: {e}")))?;
            for (i, f) in frames.iter().enumerate().rev() {
                let offset = s.row.base_offset + i as i64;
                let dead = q.dead.contains(&(s.partition_id.clone(), offset));
                let (st, consumed, group_count) = message_status(p, &groups, offset, dead, now);
                if status.is_some_and(|w| w != st) {
                    continue;
                }
                let at = Place {
                    segment: s,
                    partition: p,
                    queue: q,
                    offset,
                };
                matched.push(listed_message(broker, &at, f, (st, consumed, group_count))?);
                if matched.len() >= wanted {
                    break 'segments;
                }
            }
            if read >= MAX_SEGMENTS_PER_LISTING {
                truncated = true;
                break 'segments;
            }
        }
    }
    let mut groups: Vec<String> = queues
        .values()
        .flatten()
        .flat_map(|q| q.groups.iter().cloned())
        .collect();
    groups.sort();
    groups.dedup();
    let messages = page(matched, limit, offset);
    ok(
        &json!({"total": messages.len(), "messages": messages, "mode": mode_json(&groups),
               "truncated": truncated, "pagination": {"limit": limit, "offset": offset}}),
    )
}

async fn stored_message(broker: &Broker, pid: &str, tx: &str) -> Result<StoredMessage, Failure> {
    requests::check_name("transactionId", tx)?;
    storage_reads::message(broker, pid, tx)
        .await?
        .ok_or_else(|| not_found("Message not found"))
}

/// GET /api/v1/messages/{partitionId}/{transactionId}.
pub async fn get_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    let p = &m.partition;
    // The queue's configuration and the groups that reached this partition: one row each,
    // not the queue's totals (a queue may have 100k partitions).
    let config = storage_reads::queue_config(broker, &p.queue)
        .await?
        .ok_or_else(|| not_found("Message not found"))?;
    let groups: Vec<String> = p.cursors.iter().map(|c| c.group.clone()).collect();
    let frame = slice_blob(
        &m.segment.blob,
        m.segment.start_idx as usize,
        1,
        m.segment.msg_count as usize,
    )
    .map_err(|e| Failure::server(format!("reading a stored segment: {e}")))?
    .pop()
    .ok_or_else(|| Failure::server("a stored segment held no frame at the message's offset"))?;
    let (payload, encrypted) = frame_payload(broker, &frame)?;
    let now = broker.now();
    let (status, consumed, group_count) =
        message_status(p, &groups, m.offset, !m.dead_letters.is_empty(), now);
    let letter = m.dead_letters.first();
    let consumer_groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let c = p.cursor(g);
            json!({"name": g, "consumed": c.is_some_and(|c| c.committed >= m.offset),
                   "leaseExpiresAt": c.filter(|c| c.leased_through.is_some_and(|e| e >= m.offset))
                       .and_then(|c| c.leased_until).map(iso)})
        })
        .collect();
    let c = &config;
    ok(&json!({
        "id": frame.message_id.to_string(), "transactionId": frame.transaction_id,
        "partitionId": p.partition_id, "queuePath": format!("{}/{}", p.queue, p.partition),
        "queue": p.queue, "partition": p.partition, "namespace": c.namespace, "task": c.task,
        "status": status, "payload": payload, "isEncrypted": encrypted,
        "traceId": frame.trace_id.map(|t| t.to_string()), "producerSub": frame.producer,
        "createdAt": iso(m.segment.created_at), "offset": m.offset,
        "errorMessage": letter.and_then(|d| d.error.clone()),
        "retryCount": letter.map(|d| d.retry_count),
        "deadLetters": m.dead_letters.iter().map(|d| json!({"id": d.id, "consumerGroup": d.group,
            "errorMessage": d.error, "retryCount": d.retry_count, "failedAt": iso(d.failed_at)})).collect::<Vec<_>>(),
        "leaseExpiresAt": p.cursor(QUEUE_MODE_GROUP).and_then(|c| c.leased_until).map(iso),
        "queueConfig": {"leaseTime": c.lease_time_secs, "retryLimit": c.retry_limit,
                        "retryDelay": c.retry_delay_ms, "ttl": c.ttl_secs, "priority": c.priority},
        "mode": {"consumedByGroups": consumed, "busGroupsCount": group_count,
                 "hasQueueMode": groups.iter().any(|g| g == QUEUE_MODE_GROUP),
                 "type": mode_json(&groups)["type"]},
        "consumerGroups": consumer_groups,
    }))
}

/// DELETE /api/v1/messages/{pid}/{tx}: removes the message's dead letters. A message in the
/// partition log is part of an immutable segment and of every group's offsets: it cannot be
/// removed alone (seek a group past it instead); that answers 409 and changes nothing.
pub async fn delete_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    if m.dead_letters.is_empty() {
        return Ok(http::json(
            StatusCode::CONFLICT,
            &json!({"success": false, "partitionId": pid, "transactionId": tx,
                    "error": "only dead letters can be deleted: a message in the partition log is removed by retention, or skipped by seeking its consumer group past it"}),
        ));
    }
    let n = broker.delete_dead_letters_of(pid, tx).await?;
    ok(
        &json!({"success": n > 0, "partitionId": pid, "transactionId": tx,
               "deadLettersDeleted": n, "message": "Message deleted successfully"}),
    )
}

/// POST /api/v1/messages/{pid}/{tx}/retry: replays the message's dead letter as a new message
/// (under a new transactionId, so de-duplication cannot drop it) and removes the dead letter,
/// in one transaction.
pub async fn retry_message(broker: &Arc<Broker>, pid: &str, tx: &str) -> Result<Reply, Failure> {
    let m = stored_message(broker, pid, tx).await?;
    let Some(letter) = m.dead_letters.first() else {
        return Ok(http::json(
            StatusCode::NOT_FOUND,
            &json!({"success": false, "partitionId": pid, "transactionId": tx,
                    "error": "Message not found", "message": "the message has no dead letter to retry"}),
        ));
    };
    match broker.requeue_dead_letter(letter.id).await? {
        None => Err(not_found("Message not found")),
        Some(r) => ok(
            &json!({"success": true, "queue": r.queue, "partition": r.partition,
            "replayedAs": {"messageId": r.outcome.message_id().to_string(),
                           "partitionId": r.outcome.partition_id()},
            "dlqRowRemoved": true}),
        ),
    }
}
