//! The pop endpoints: parse, then drive the core's pop machine. The driver is thin: it performs
//! the machine's effects (permit, storage, park on the queue's wake gate, reply) and feeds back
//! the events. All decisions live in `queen_core::pop`.

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use queen_core::autopilot;
use queen_core::claim::ConflationEcho;
use queen_core::delivery::{claims_to_messages, DeliveredMessage};
use queen_core::ledger::DeliveredBatch;
use queen_core::params::{PopParams, PopShape};
use queen_core::pop::{PopEffect, PopInput, PopMachine, PopReply, StorageCommand, StorageReply};
use queen_core::storage::{AckItem, AckStatus, Claim};
use queen_core::time::format_iso_micros;
use queen_core::wire::{encode_pop_frames, FramedAnswer, FramedClaim, POP_FRAMES_CONTENT_TYPE};
use queen_core::WorkerId;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use crate::broker::{past_storage_deadline, Broker, CrashPoint};
use crate::helpers::lock;
use crate::http::Routed;
use crate::http::{self, Failure, Reply};
use crate::storage_reads;

/// Starts a pop in its own driver task; its reply comes on the returned channel.
pub(crate) fn start(
    broker: Arc<Broker>,
    shape: PopShape,
    query: Option<&str>,
) -> Result<Routed, Failure> {
    let pairs = http::query_pairs(query)?;
    let params = match PopParams::from_query(
        shape,
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        broker.config.default_timeout_ms,
    ) {
        Ok(p) => p,
        Err(e) => {
            broker.metrics.bad_requests.inc();
            return Ok(Routed::Now(http::error(&Failure::bad(e.to_string()))));
        }
    };
    let (tx, rx) = oneshot::channel();
    tokio::spawn(drive(broker, params, tx));
    Ok(Routed::Later(rx))
}

/// Drives one pop machine to its reply. Runs in its own task so that it notices a client that
/// went away (the reply channel closes): a parked pop is cancelled, and a batch leased for a
/// client that is gone is released at once instead of waiting out its lease. The waits other
/// than parking are boxed, so a parked task does not carry their state beside the park's
/// (1,976 -> 1,752 bytes measured; the machine and the park's select stay inline).
async fn drive(broker: Arc<Broker>, params: PopParams, mut tx: oneshot::Sender<Reply>) {
    let queue = params.queue_name().map(str::to_string);
    let mut shutdown = broker.shutting_down.subscribe();
    let mut machine = PopMachine::new(
        params,
        broker.mint_worker(),
        broker.pop_config,
        broker.now(),
    );
    let wake_group = machine
        .wakes_one_per_group()
        .then(|| machine.params().consumer_group.clone());
    let mut gate = broker.gate(queue.as_deref(), wake_group.as_deref());
    let mut input = PopInput::Start;
    loop {
        // Mark the gate seen before the check: a push after this point opens it for us. One that
        // came while the pop waited for a permit or for storage is told to the machine first:
        // the answer it is about to get was read before that event.
        let woke_meanwhile = gate.mark_seen();
        {
            let mut ctx = lock(&broker.pop_ctx);
            machine.handle_after_gate_check(input, woke_meanwhile, broker.now(), &mut ctx);
            // Its verdicts may have put an earlier revisit on a ring's wheel.
            broker.rearm_ticker_if_needed(&ctx);
        }
        let mut next = None;
        while let Some(effect) = machine.poll() {
            match effect {
                PopEffect::AcquirePermit => {
                    next = Some(Box::pin(acquire_permit(&broker, &mut tx)).await);
                }
                PopEffect::ReleasePermit { rtt_us } => broker.limiter.release(rtt_us),
                PopEffect::PassWake => {
                    if let (Some(queue), Some(group)) = (&queue, &wake_group) {
                        broker.pass_wake(queue, group);
                    }
                }
                PopEffect::Storage { id, command } => {
                    broker.metrics.storage_calls.inc();
                    let started = broker.now();
                    let call = async {
                        match (command, &broker.pop_rounds) {
                            (StorageCommand::PopList { req, candidates }, Some(rounds)) => {
                                rounds.call((req, candidates)).await.map(StorageReply::Pop)
                            }
                            (command, _) => Box::pin(broker.pop_storage_call(command)).await,
                        }
                    };
                    // Past the deadline the machine takes storage as unreachable (it parks or
                    // answers 204); a claim that committed meanwhile comes back when its lease
                    // ends.
                    let deadline = broker.config.storage_deadline();
                    let result = tokio::time::timeout(deadline, call)
                        .await
                        .unwrap_or_else(|_| Err(past_storage_deadline(deadline)));
                    broker
                        .metrics
                        .record_storage("pop", started.micros_until(broker.now()));
                    if let Err(e) = &result {
                        broker.note_storage_error("pop", e);
                    }
                    next = Some(PopInput::StorageDone { id, result });
                }
                PopEffect::Park { until } => {
                    match park(&broker, until, &mut gate, &mut tx, &mut shutdown).await {
                        Some(i) => next = Some(i),
                        None => return shut_down(&broker, tx),
                    }
                }
                PopEffect::Reply(reply) => {
                    let params = machine.params();
                    let (group, framed) = (params.consumer_group.clone(), params.frames);
                    let echo = Echoes {
                        conflation: machine.conflation_echo(),
                        autopilot: machine.autopilot_echo(),
                    };
                    Box::pin(finish(&broker, reply, &group, framed, echo, tx)).await;
                    return;
                }
            }
        }
        if machine.is_done() {
            // Cancelled: the client is gone and nothing was claimed.
            broker.metrics.pops_cancelled.inc();
            return;
        }
        // The machine answers every input the driver feeds with its next wait (permit, storage,
        // park) or its reply: core::pop's contract, tested there.
        let Some(i) = next else {
            unreachable!("a pop machine that is not done always names its next wait");
        };
        input = i;
    }
}

/// Waits for a serving permit, or for the client to leave.
async fn acquire_permit(broker: &Broker, tx: &mut oneshot::Sender<Reply>) -> PopInput {
    tokio::select! {
        // biased: a fixed poll order keeps simulated runs reproducible.
        biased;
        _ = broker.limiter.acquire() => PopInput::PermitGranted,
        _ = tx.closed() => PopInput::Cancel,
    }
}

/// Shutting down: parked pops answer empty.
fn shut_down(broker: &Broker, tx: oneshot::Sender<Reply>) {
    broker.metrics.pops_empty.inc();
    let _ = tx.send(http::no_content());
}

/// Parks until a wake, the machine's timer (its backoff re-check, or the time storage said its
/// partition becomes deliverable), the client leaving, or shutdown (`None`). A queue-wide pop on
/// the hot-list path hears of its ring's revisits as wakes, from the broker's wheel ticker.
async fn park(
    broker: &Broker,
    until: queen_core::Timestamp,
    gate: &mut crate::broker::GateWatch,
    tx: &mut oneshot::Sender<Reply>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<PopInput> {
    let now = broker.now();
    let sleep = Duration::from_micros(u64::try_from(until.0 - now.0).unwrap_or(0));
    broker.metrics.parked.inc();
    broker.crash_point(CrashPoint::LongPollParked).await;
    let woke = tokio::select! {
        biased;
        () = gate.changed() => {
            broker.metrics.record_wake(gate.opened_at().micros_until(broker.now()));
            Some(PopInput::Wake)
        }
        _ = tokio::time::sleep(sleep) => Some(PopInput::Timer),
        _ = tx.closed() => Some(PopInput::Cancel),
        _ = shutdown.wait_for(|s| *s) => None,
    };
    broker.metrics.parked.dec();
    woke
}

/// What an answer with a body says of the request's conflation and autopilot.
#[derive(Clone, Copy)]
struct Echoes {
    conflation: ConflationEcho,
    autopilot: Option<autopilot::Echo>,
}

async fn finish(
    broker: &Arc<Broker>,
    reply: PopReply,
    group: &str,
    framed: bool,
    echo: Echoes,
    tx: oneshot::Sender<Reply>,
) {
    match reply {
        PopReply::Empty if echo.conflation.says_anything() => {
            // A client that asked for conflation checks the echo on every answer, empty ones
            // included, so this one is a 200.
            broker.metrics.pops_empty.inc();
            let _ = tx.send(http::json(StatusCode::OK, &empty_answer(echo)));
        }
        PopReply::Empty => {
            broker.metrics.pops_empty.inc();
            let _ = tx.send(http::no_content());
        }
        PopReply::Failed(e) => {
            broker.metrics.pops_error.inc();
            tracing::warn!(error = %e, "pop failed");
            let _ = tx.send(http::error(&Failure::from(e)));
        }
        PopReply::Messages {
            worker,
            auto_ack,
            claims,
        } => {
            broker.crash_point(CrashPoint::PopClaimed).await;
            broker.metrics.pops_messages.inc();
            // Queen 2.x answers a conflating group in JSON, where the echo has its place.
            let framed = framed && !echo.conflation.says_anything();
            let answer = Answering {
                broker,
                worker,
                auto_ack,
                group,
                framed,
                echo,
            };
            let mut claims = claims;
            let mut rendered = answer.render(&claims).await;
            if rendered.is_err() {
                // A claim that cannot be read must not cost the others their delivery.
                let claimed = claims.len();
                let others_may_read = answer.set_aside_unreadable(&mut claims);
                if claims.len() < claimed && !claims.is_empty() {
                    rendered = answer.render(&claims).await;
                }
                // Given back before the answer is sent, so the client's next pop (or another
                // broker's) finds them.
                if !auto_ack && !others_may_read.is_empty() {
                    release(broker, &others_may_read, worker, group).await;
                }
            }
            match rendered {
                Ok((reply, batches)) => {
                    // Recorded before the answer leaves, so the client's ack cannot overtake it.
                    let lease_id = worker.to_string();
                    if !auto_ack {
                        lock(&broker.delivered).record(group, &lease_id, batches);
                    }
                    if tx.send(reply).is_err() && !auto_ack {
                        // The client left before the answer: give the leases back now.
                        lock(&broker.delivered).forget(group, &lease_id);
                        release(broker, &claims, worker, group).await;
                    }
                }
                Err(f) => {
                    broker.metrics.server_errors.inc();
                    tracing::warn!(error = %f.message, "a claimed batch could not be rendered; its leases are given back but for those no broker can read");
                    // Given back before the error is sent, so the client's next pop finds them.
                    if !auto_ack {
                        release(broker, &claims, worker, group).await;
                    }
                    let _ = tx.send(http::error(&f));
                }
            }
        }
    }
}

/// What an answer to one pop is rendered with.
struct Answering<'a> {
    broker: &'a Arc<Broker>,
    worker: WorkerId,
    auto_ack: bool,
    group: &'a str,
    framed: bool,
    echo: Echoes,
}

impl Answering<'_> {
    async fn render(&self, claims: &[Claim]) -> Result<(Reply, Vec<DeliveredBatch>), Failure> {
        let (broker, worker, auto_ack, group) =
            (self.broker, self.worker, self.auto_ack, self.group);
        let framed = if self.framed {
            render_framed(broker, claims, worker, auto_ack, group, self.echo.autopilot).await?
        } else {
            None
        };
        match framed {
            Some((bytes, batches)) => Ok((
                http::bytes(StatusCode::OK, bytes, POP_FRAMES_CONTENT_TYPE),
                batches,
            )),
            None => render(broker, claims, worker, auto_ack, group, self.echo)
                .map(|(bytes, batches)| (http::json_bytes(StatusCode::OK, bytes), batches)),
        }
    }

    /// Takes out of `claims` those whose messages cannot be read, each logged with its offsets,
    /// and answers the ones another broker may read. Those no broker can read (a segment that
    /// does not decode, a sealed payload the cluster's key does not open, a payload that is not
    /// JSON) are dropped: their leases are kept until they end, not given back: given back, the group's next pop
    /// would claim the same messages and fail again at once, and again, while a kept lease holds
    /// them off for the queue's `leaseTime` (with autoAck their cursor has already moved past
    /// them: they are skipped, and the log says which). A sealed payload on a broker without a
    /// key is unreadable here only: it goes back for a broker with the key.
    fn set_aside_unreadable(&self, claims: &mut Vec<Claim>) -> Vec<Claim> {
        let cipher = self.broker.config.cipher.as_deref();
        let mut others_may_read = vec![];
        for c in std::mem::take(claims) {
            let Err((f, anywhere)) = readable(cipher, &c) else {
                claims.push(c);
                continue;
            };
            let (queue, partition, group) = (&c.queue, &c.partition, self.group);
            let (first_offset, last_offset) = (c.first_offset, c.last_offset);
            if !anywhere {
                tracing::warn!(%queue, %partition, first_offset, last_offset, %group, error = %f.message,
                    "claimed messages cannot be opened by this broker; given back");
                others_may_read.push(c);
            } else if self.auto_ack {
                tracing::error!(%queue, %partition, first_offset, last_offset, %group, error = %f.message,
                    "claimed messages cannot be read; skipped (autoAck)");
            } else {
                tracing::error!(%queue, %partition, first_offset, last_offset, %group, error = %f.message,
                    "claimed messages cannot be read; their lease is kept until it ends");
            }
        }
        others_may_read
    }
}

/// Whether a claim's messages can be read here; if not, why, and whether no broker can (else
/// only one with the cluster's payload key can).
fn readable(
    cipher: Option<&crate::sealing::PayloadCipher>,
    c: &Claim,
) -> Result<(), (Failure, bool)> {
    let messages = claims_to_messages(std::slice::from_ref(c))
        .map_err(|e| (Failure::server(format!("corrupt segment: {e}")), true))?;
    messages.iter().try_for_each(|m| {
        payload_json(cipher, m)
            .map(drop)
            .map_err(|f| (f, cipher.is_some() || !m.frame.encrypted))
    })
}

/// A delivered message's payload as the JSON the answer carries: opened when sealed.
fn payload_json(
    cipher: Option<&crate::sealing::PayloadCipher>,
    m: &DeliveredMessage,
) -> Result<Box<RawValue>, Failure> {
    let payload = crate::sealing::plaintext(cipher, &m.frame).map_err(Failure::server)?;
    let text = String::from_utf8(payload.into_owned())
        .map_err(|_| Failure::server("stored payload is not UTF-8"))?;
    RawValue::from_string(text)
        .map_err(|e| Failure::server(format!("stored payload is not JSON: {e}")))
}

/// Releases the leases of claims nobody received (a retry ack: no retry budget is charged).
async fn release(broker: &Arc<Broker>, claims: &[Claim], worker: WorkerId, group: &str) {
    let messages = match claims_to_messages(claims) {
        Ok(messages) => messages,
        Err(e) => {
            // Callers give back only claims that were read (`set_aside_unreadable`).
            tracing::error!(error = %e, "leases to give back cannot be read; they are kept until they end");
            return;
        }
    };
    for c in claims {
        let Some(first) = messages.iter().find(|m| m.partition_id == c.partition_id) else {
            continue;
        };
        let item = AckItem {
            transaction_id: first.frame.transaction_id.clone(),
            partition_id: c.partition_id.clone(),
            status: AckStatus::Retry,
            lease_id: Some(worker.to_string()),
            error: None,
        };
        match broker.release_undelivered(group, vec![item]).await {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "releasing the lease of an undelivered batch failed; it frees at expiry")
            }
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Message<'a> {
    id: String,
    transaction_id: &'a str,
    trace_id: Option<String>,
    data: &'a RawValue,
    /// Omitted for messages pushed without auth, as Queen 2.x does.
    #[serde(skip_serializing_if = "Option::is_none")]
    producer_sub: Option<&'a str>,
    created_at: String,
    queue: &'a str,
    partition: &'a str,
    partition_id: &'a str,
    lease_id: &'a str,
    consumer_group: &'a str,
    offset: i64,
    /// Deliveries of this batch before this one (the attempt counter minus one).
    retry_count: u32,
    delivery_attempt: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    success: bool,
    queue: &'a str,
    partition: &'a str,
    partition_id: &'a str,
    lease_id: &'a str,
    consumer_group: &'a str,
    partitions_claimed: usize,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    conflation: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    conflation_conflict: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    autopilot: Option<autopilot::Echo>,
}

/// An empty answer that must still carry the conflation echo (and so the autopilot's too).
fn empty_answer(echo: Echoes) -> serde_json::Value {
    let mut answer = serde_json::json!({"success": true, "messages": []});
    if echo.conflation.conflation {
        answer["conflation"] = true.into();
    }
    if echo.conflation.conflict {
        answer["conflationConflict"] = true.into();
    }
    if let Some(a) = echo.autopilot {
        answer["autopilot"] = serde_json::json!(a);
    }
    answer
}

/// The 0.15 answer shape; per-message fields are authoritative on multi-partition pops.
fn render(
    broker: &Broker,
    claims: &[Claim],
    worker: WorkerId,
    auto_ack: bool,
    group: &str,
    echo: Echoes,
) -> Result<(Vec<u8>, Vec<DeliveredBatch>), Failure> {
    let delivered =
        claims_to_messages(claims).map_err(|e| Failure::server(format!("corrupt segment: {e}")))?;
    let lease_id = if auto_ack {
        String::new()
    } else {
        worker.to_string()
    };
    let cipher = broker.config.cipher.as_deref();
    let payloads: Vec<Box<RawValue>> = delivered
        .iter()
        .map(|m| payload_json(cipher, m))
        .collect::<Result<_, _>>()?;
    record_delivery(broker, claims);
    let mut messages = Vec::with_capacity(delivered.len());
    for (m, data) in delivered.iter().zip(payloads.iter()) {
        messages.push(Message {
            id: m.frame.message_id.to_string(),
            transaction_id: &m.frame.transaction_id,
            trace_id: m.frame.trace_id.map(|t| t.to_string()),
            data,
            producer_sub: m.frame.producer.as_deref(),
            created_at: format_iso_micros(m.created_at),
            queue: &m.queue,
            partition: &m.partition,
            partition_id: &m.partition_id,
            lease_id: &lease_id,
            consumer_group: group,
            offset: m.offset,
            retry_count: m.attempt_count.saturating_sub(1),
            delivery_attempt: m.attempt_count.max(1),
        });
    }
    let first = claims.first();
    let answer = Answer {
        success: true,
        queue: first.map_or("", |c| c.queue.as_str()),
        partition: first.map_or("", |c| c.partition.as_str()),
        partition_id: first.map_or("", |c| c.partition_id.as_str()),
        lease_id: &lease_id,
        consumer_group: group,
        partitions_claimed: claims.len(),
        messages,
        conflation: echo.conflation.conflation,
        conflation_conflict: echo.conflation.conflict,
        autopilot: echo.autopilot,
    };
    let bytes = serde_json::to_vec(&answer)
        .map_err(|e| Failure::server(format!("rendering the answer: {e}")))?;
    let batches = if auto_ack {
        vec![]
    } else {
        ledger_batches(claims, &delivered, |c| c.partition_id.clone())
    };
    Ok((bytes, batches))
}

/// Each claim's delivered messages as the ledger keeps them, named as the answer named the
/// partition (`reference`).
fn ledger_batches(
    claims: &[Claim],
    delivered: &[DeliveredMessage],
    reference: impl Fn(&Claim) -> String,
) -> Vec<DeliveredBatch> {
    claims
        .iter()
        .filter_map(|c| {
            let mine = || {
                delivered
                    .iter()
                    .filter(|m| m.partition_id == c.partition_id)
            };
            let end = mine().next_back()?.offset;
            DeliveredBatch::new(
                &reference(c),
                &c.partition_id,
                &c.queue,
                &c.partition,
                end,
                mine().map(|m| m.frame.transaction_id.as_str()),
            )
        })
        .collect()
}

/// Counts what an answer delivers, and each message's lag (a segment's messages share their
/// created_at).
fn record_delivery(broker: &Broker, claims: &[Claim]) {
    let now = broker.now();
    for row in claims.iter().flat_map(|c| c.rows.iter()) {
        let lag = u64::try_from(now.0 - row.created_at.0).unwrap_or(0);
        for _ in 0..row.take {
            broker.metrics.record_lag(lag);
        }
        broker
            .metrics
            .messages_delivered
            .inc_by(u64::from(row.take));
    }
}

/// The framed answer (`QPF1`), or `None` where it cannot carry this answer and JSON must: claims
/// in more than one queue (the frame names one), or partition numbers storage could not give.
async fn render_framed(
    broker: &Broker,
    claims: &[Claim],
    worker: WorkerId,
    auto_ack: bool,
    group: &str,
    autopilot: Option<autopilot::Echo>,
) -> Result<Option<(Vec<u8>, Vec<DeliveredBatch>)>, Failure> {
    let Some(queue) = claims.first().map(|c| c.queue.as_str()) else {
        return Ok(None);
    };
    // A broker with a payload key answers JSON, as Queen 2.x's does: the client refuses
    // sealed frames, and opening them means re-framing every record.
    if claims.iter().any(|c| c.queue != queue) || broker.config.cipher.is_some() {
        return Ok(None);
    }
    let ids: Vec<String> = claims.iter().map(|c| c.partition_id.clone()).collect();
    let numbers = match storage_reads::partition_numbers(broker, &ids).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "partition numbers unavailable; answering JSON");
            return Ok(None);
        }
    };
    let mut framed = Vec::with_capacity(claims.len());
    for (claim, number) in claims.iter().zip(numbers) {
        let Some(partition_number) = number else {
            return Ok(None);
        };
        framed.push(FramedClaim {
            claim,
            partition_number,
        });
    }
    // The ledger needs the ids the frames carry: the segments are opened for it only (the
    // answer passes them through), and only when the batch is leased.
    let batches = if auto_ack {
        vec![]
    } else {
        let delivered = claims_to_messages(claims)
            .map_err(|e| Failure::server(format!("corrupt segment: {e}")))?;
        let number_of = |c: &Claim| {
            framed
                .iter()
                .find(|f| f.claim.partition_id == c.partition_id)
                .map_or_else(String::new, |f| f.partition_number.to_string())
        };
        ledger_batches(claims, &delivered, number_of)
    };
    let lease_id = if auto_ack {
        String::new()
    } else {
        worker.to_string()
    };
    // The answer's own keys beyond the frames ride in version 1's JSON object.
    let extra = autopilot
        .map(|a| serde_json::to_vec(&serde_json::json!({ "autopilot": a })))
        .transpose()
        .map_err(|e| Failure::server(format!("rendering the autopilot echo: {e}")))?;
    let bytes = encode_pop_frames(&FramedAnswer {
        queue,
        lease_id: &lease_id,
        consumer_group: group,
        extra: extra.as_deref(),
        claims: framed,
    })
    .map_err(|e| Failure::server(format!("framing the answer: {e}")))?;
    record_delivery(broker, claims);
    broker.metrics.framed_pops.inc();
    Ok(Some((bytes, batches)))
}
