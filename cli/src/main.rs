//! `queenctl`: what an operator asks a broker from a shell, over its admin API. Every command
//! prints a table (or, with `--json`, the broker's answer as it came) and exits non-zero with
//! the broker's error when a request fails.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(
    name = "queenctl",
    version,
    about = "Operate a Queen broker: queues, consumer-group lag, dead letters, seek, message lookup."
)]
struct Cli {
    /// The broker's base URL.
    #[arg(long, env = "QUEEN_URL", default_value = "http://localhost:6632")]
    url: String,
    /// A bearer token, when the broker runs with JWT auth.
    #[arg(long, env = "QUEEN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the broker's JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Queues with their partitions, stored, pending, in-flight and dead-lettered messages.
    Queues,
    /// One queue's partitions (a page of them, by name) and every group's cursor on them.
    Queue {
        name: String,
        /// Partitions after this one (the `next` a page names).
        #[arg(long)]
        after: Option<String>,
        /// Partitions in the page (the broker takes up to 10,000).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Consumer-group lag per (group, queue); with --min-seconds, the lagging partitions.
    Lag {
        /// Only this group.
        #[arg(long)]
        group: Option<String>,
        /// List partitions whose oldest unconsumed message is older than this.
        #[arg(long)]
        min_seconds: Option<u64>,
    },
    /// Dead letters: list or requeue.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// Moves a consumer group's cursors on a queue to the end, or to a time.
    Seek {
        group: String,
        queue: String,
        /// Skip everything stored now.
        #[arg(long, conflicts_with = "timestamp")]
        to_end: bool,
        /// Resume after the last message at or before this ISO-8601 time.
        #[arg(long)]
        timestamp: Option<String>,
    },
    /// One message by partition id and transactionId, with its traces.
    Message {
        partition_id: String,
        transaction_id: String,
    },
    /// Messages of a queue, newest first.
    Messages {
        queue: String,
        #[arg(long)]
        partition: Option<String>,
        /// pending, processing, completed or dead_letter.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// The broker's health.
    Health,
}

#[derive(Subcommand, Debug)]
enum DlqAction {
    /// Dead letters of a queue, newest first.
    List {
        queue: String,
        #[arg(long)]
        group: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Pushes dead letters (by id, as `dlq list` shows) again as new messages.
    Requeue {
        #[arg(required = true)]
        ids: Vec<i64>,
    },
}

struct Broker {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Broker {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self.http.request(
            method.clone(),
            format!("{}{path}", self.url.trim_end_matches('/')),
        );
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("{method} {path}: reading the answer: {e}"))?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            Ok(value)
        } else {
            let why = value
                .get("error")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_string);
            Err(format!("{method} {path}: {status}: {why}"))
        }
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        self.call(reqwest::Method::GET, path, None).await
    }
}

/// Percent-encodes a path segment or query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A plain table: columns padded to their widest cell.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect(), &mut out);
    for r in rows {
        line(r.clone(), &mut out);
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A command's answer: the broker's JSON, and the table printed without `--json`.
type Answer = Result<(Value, String), String>;

async fn run(cli: Cli) -> Result<String, String> {
    let broker = Broker {
        http: reqwest::Client::new(),
        url: cli.url,
        token: cli.token,
    };
    let (answer, text) = match cli.command {
        Command::Queues => queues(&broker).await?,
        Command::Queue { name, after, limit } => queue(&broker, name, after, limit).await?,
        Command::Lag {
            group,
            min_seconds: Some(secs),
        } => lagging(&broker, group, secs).await?,
        Command::Lag {
            group,
            min_seconds: None,
        } => lag(&broker, group).await?,
        Command::Dlq {
            action:
                DlqAction::List {
                    queue,
                    group,
                    limit,
                },
        } => dlq_list(&broker, queue, group, limit).await?,
        Command::Dlq {
            action: DlqAction::Requeue { ids },
        } => dlq_requeue(&broker, ids).await?,
        Command::Seek {
            group,
            queue,
            to_end,
            timestamp,
        } => seek(&broker, group, queue, to_end, timestamp).await?,
        Command::Message {
            partition_id,
            transaction_id,
        } => message(&broker, partition_id, transaction_id).await?,
        Command::Messages {
            queue,
            partition,
            status,
            limit,
        } => messages(&broker, queue, partition, status, limit).await?,
        Command::Health => health(&broker).await?,
    };
    Ok(if cli.json {
        format!("{answer:#}\n")
    } else {
        text
    })
}

/// Queue totals (`GET /api/v1/resources/queues`).
async fn queues(broker: &Broker) -> Answer {
    let v = broker.get("/api/v1/resources/queues?limit=10000").await?;
    let rows = list(&v, "queues")
        .iter()
        .map(|q| {
            let m = &q["messages"];
            vec![
                cell(&q["name"]),
                cell(&q["partitions"]),
                cell(&m["total"]),
                cell(&m["pending"]),
                cell(&m["processing"]),
                cell(&m["deadLetter"]),
            ]
        })
        .collect::<Vec<_>>();
    let t = table(
        &[
            "queue",
            "partitions",
            "stored",
            "pending",
            "in flight",
            "dead letters",
        ],
        &rows,
    );
    Ok((v, t))
}

/// One queue's partitions and how far behind each group is (`GET /api/v1/status/queues/{name}`).
async fn queue(broker: &Broker, name: String, after: Option<String>, limit: u32) -> Answer {
    let after = after.map_or_else(String::new, |a| format!("&after={}", enc(&a)));
    let v = broker
        .get(&format!(
            "/api/v1/status/queues/{}?limit={limit}{after}",
            enc(&name)
        ))
        .await?;
    let rows = list(&v, "partitions")
        .iter()
        .map(|p| {
            let cursors = list(&p["cursor"], "groups")
                .iter()
                .map(|g| format!("{}:{}", cell(&g["consumerGroup"]), cell(&g["pending"])))
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                cell(&p["name"]),
                cell(&p["messages"]["total"]),
                cell(&p["messages"]["pending"]),
                cell(&p["lastOffset"]),
                cursors,
            ]
        })
        .collect::<Vec<_>>();
    let t = table(
        &[
            "partition",
            "stored",
            "pending",
            "last offset",
            "behind (group:messages)",
        ],
        &rows,
    );
    let t = match v["pagination"]["next"].as_str() {
        Some(next) => format!(
            "{t}{} of {} partitions; the next page: --after {next}\n",
            rows.len(),
            cell(&v["partitionsTotal"])
        ),
        None => t,
    };
    Ok((v, t))
}

/// Partitions lagging at least `secs` (`GET /api/v1/consumer-groups/lagging`).
async fn lagging(broker: &Broker, group: Option<String>, secs: u64) -> Answer {
    let v = broker
        .get(&format!(
            "/api/v1/consumer-groups/lagging?minLagSeconds={secs}"
        ))
        .await?;
    let rows = v
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|r| group.as_deref().is_none_or(|g| r["consumer_group"] == g))
        .map(|r| {
            vec![
                cell(&r["consumer_group"]),
                cell(&r["queue_name"]),
                cell(&r["partition_name"]),
                cell(&r["offset_lag"]),
                cell(&r["time_lag_seconds"]),
            ]
        })
        .collect::<Vec<_>>();
    let t = table(
        &["group", "queue", "partition", "behind", "lag seconds"],
        &rows,
    );
    Ok((v, t))
}

/// Each group's lag per queue (`GET /api/v1/consumer-groups`).
async fn lag(broker: &Broker, group: Option<String>) -> Answer {
    let v = broker.get("/api/v1/consumer-groups").await?;
    let rows = v
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|r| group.as_deref().is_none_or(|g| r["name"] == g))
        .map(|r| {
            vec![
                cell(&r["name"]),
                cell(&r["queueName"]),
                cell(&r["state"]),
                cell(&r["totalLag"]),
                cell(&r["maxTimeLag"]),
                cell(&r["partitionsWithLag"]),
            ]
        })
        .collect::<Vec<_>>();
    let t = table(
        &[
            "group",
            "queue",
            "state",
            "lag",
            "lag seconds",
            "partitions behind",
        ],
        &rows,
    );
    Ok((v, t))
}

/// Dead letters of a queue (`GET /api/v1/dlq`).
async fn dlq_list(broker: &Broker, queue: String, group: Option<String>, limit: u32) -> Answer {
    let mut path = format!("/api/v1/dlq?queue={}&limit={limit}", enc(&queue));
    if let Some(g) = group {
        path.push_str(&format!("&consumerGroup={}", enc(&g)));
    }
    let v = broker.get(&path).await?;
    let rows = list(&v, "messages")
        .iter()
        .map(|m| {
            vec![
                cell(&m["dlqId"]),
                cell(&m["failedAt"]),
                cell(&m["partition"]),
                cell(&m["transactionId"]),
                cell(&m["consumerGroup"]),
                cell(&m["errorMessage"]),
            ]
        })
        .collect::<Vec<_>>();
    let mut t = table(
        &[
            "id",
            "failed at",
            "partition",
            "transactionId",
            "group",
            "error",
        ],
        &rows,
    );
    let _ = writeln!(t, "{} dead letters in all", cell(&v["total"]));
    Ok((v, t))
}

/// Requeues dead letters by id (`POST /api/v1/dlq/{id}/requeue`).
async fn dlq_requeue(broker: &Broker, ids: Vec<i64>) -> Answer {
    let mut answers = vec![];
    let mut t = String::new();
    for id in ids {
        let v = broker
            .call(
                reqwest::Method::POST,
                &format!("/api/v1/dlq/{id}/requeue"),
                None,
            )
            .await?;
        let _ = writeln!(
            t,
            "requeued {id} to {}/{} as message {}",
            cell(&v["queue"]),
            cell(&v["partition"]),
            cell(&v["messageId"])
        );
        answers.push(v);
    }
    Ok((Value::Array(answers), t))
}

/// Moves a group's cursors on a queue (`POST /api/v1/consumer-groups/{g}/queues/{q}/seek`).
async fn seek(
    broker: &Broker,
    group: String,
    queue: String,
    to_end: bool,
    timestamp: Option<String>,
) -> Answer {
    let body = match (to_end, timestamp) {
        (true, _) => json!({"toEnd": true}),
        (false, Some(ts)) => json!({"timestamp": ts}),
        (false, None) => return Err("seek needs --to-end or --timestamp".into()),
    };
    let v = broker
        .call(
            reqwest::Method::POST,
            &format!(
                "/api/v1/consumer-groups/{}/queues/{}/seek",
                enc(&group),
                enc(&queue)
            ),
            Some(body),
        )
        .await?;
    let t = format!(
        "moved {} cursors of {group} on {queue}\n",
        cell(&v["partitionsUpdated"])
    );
    Ok((v, t))
}

/// One message with its traces.
async fn message(broker: &Broker, partition_id: String, transaction_id: String) -> Answer {
    let path = format!("{}/{}", enc(&partition_id), enc(&transaction_id));
    let m = broker.get(&format!("/api/v1/messages/{path}")).await?;
    let traces = broker.get(&format!("/api/v1/traces/{path}")).await?;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} {} (offset {})",
        cell(&m["queuePath"]),
        cell(&m["transactionId"]),
        cell(&m["offset"])
    );
    let _ = writeln!(t, "status:  {}", cell(&m["status"]));
    let _ = writeln!(t, "created: {}", cell(&m["createdAt"]));
    if !m["errorMessage"].is_null() {
        let _ = writeln!(
            t,
            "dead letter: {} (retries {})",
            cell(&m["errorMessage"]),
            cell(&m["retryCount"])
        );
    }
    let _ = writeln!(t, "payload: {}", m["payload"]);
    for tr in list(&traces, "traces") {
        let _ = writeln!(
            t,
            "trace {} {} {} {}",
            cell(&tr["created_at"]),
            cell(&tr["event_type"]),
            cell(&tr["consumer_group"]),
            tr["data"]
        );
    }
    Ok((json!({"message": m, "traces": traces["traces"]}), t))
}

/// A queue's messages, newest first (`GET /api/v1/messages`).
async fn messages(
    broker: &Broker,
    queue: String,
    partition: Option<String>,
    status: Option<String>,
    limit: u32,
) -> Answer {
    let mut path = format!("/api/v1/messages?queue={}&limit={limit}", enc(&queue));
    for (k, v) in [("partition", partition), ("status", status)] {
        if let Some(v) = v {
            path.push_str(&format!("&{k}={}", enc(&v)));
        }
    }
    let v = broker.get(&path).await?;
    let rows = list(&v, "messages")
        .iter()
        .map(|m| {
            vec![
                cell(&m["createdAt"]),
                cell(&m["partition"]),
                cell(&m["partitionId"]),
                cell(&m["transactionId"]),
                cell(&m["status"]),
            ]
        })
        .collect::<Vec<_>>();
    let t = table(
        &[
            "created",
            "partition",
            "partitionId",
            "transactionId",
            "status",
        ],
        &rows,
    );
    Ok((v, t))
}

/// The broker's health (`GET /health`).
async fn health(broker: &Broker) -> Answer {
    let v = broker.get("/health").await?;
    let t = format!(
        "{} (database {})\n",
        cell(&v["status"]),
        cell(&v["database"])
    );
    Ok((v, t))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("queenctl: {e}");
            ExitCode::FAILURE
        }
    }
}
