//! The admin totals at scale (run after each partition-scaling size, so the database then holds
//! every partition of the sizes so far): what a pass over every partition costs, what the
//! totals routes cost answered from its snapshot, and what the routes about the size's own queue
//! cost (a page of its partitions; its totals from the snapshot once it is larger than a page),
//! each against that pass.

use std::time::Instant;

use queen_raw_client::Client;

pub struct AdminTimes {
    /// Partitions the pass read (every queue's).
    pub partitions: f64,
    pub pass_ms: f64,
    /// Medians of `ROUNDS` requests after the pass.
    pub listing_ms: f64,
    pub groups_ms: f64,
    pub overview_ms: f64,
    /// The size's own queue: its depth for one of its groups, its first page of partitions,
    /// the status view of it, and the group's partitions on it.
    pub depth_ms: f64,
    pub queue_ms: f64,
    pub queue_status_ms: f64,
    pub group_ms: f64,
    /// The message browser's first page (200) of the queue's messages.
    pub messages_ms: f64,
    /// The dashboard's other reads: the status view, the lagging cursors, the dead letters,
    /// the trace names.
    pub status_ms: f64,
    pub lagging_ms: f64,
    pub dlq_ms: f64,
    pub trace_names_ms: f64,
}

const ROUNDS: usize = 5;

async fn median_ms(c: &mut Client, path: &str) -> f64 {
    let mut ms = vec![];
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let r = c.get(path).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    ms[ROUNDS / 2]
}

pub async fn measure(addr: std::net::SocketAddr, queue: &str) -> AdminTimes {
    let mut c = Client::connect(addr).await;
    let r = c.send("POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let groups = c.get("/api/v1/consumer-groups").await.json();
    let group = groups
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["queueName"] == queue))
        .and_then(|g| g["name"].as_str())
        .unwrap_or_else(|| panic!("no consumer group reads {queue}: {groups}"))
        .to_string();
    AdminTimes {
        partitions: v["partitions"].as_f64().unwrap_or(f64::NAN),
        pass_ms: v["tookMs"].as_f64().unwrap_or(f64::NAN),
        listing_ms: median_ms(&mut c, "/api/v1/resources/queues").await,
        groups_ms: median_ms(&mut c, "/api/v1/consumer-groups").await,
        overview_ms: median_ms(&mut c, "/api/v1/resources/overview").await,
        depth_ms: median_ms(
            &mut c,
            &format!("/api/v1/resources/queues/{queue}/depth?group={group}"),
        )
        .await,
        queue_ms: median_ms(&mut c, &format!("/api/v1/resources/queues/{queue}")).await,
        queue_status_ms: median_ms(&mut c, &format!("/api/v1/status/queues/{queue}")).await,
        group_ms: median_ms(
            &mut c,
            &format!("/api/v1/consumer-groups/{group}?queue={queue}"),
        )
        .await,
        messages_ms: median_ms(&mut c, &format!("/api/v1/messages?queue={queue}")).await,
        status_ms: median_ms(&mut c, "/api/v1/status").await,
        lagging_ms: median_ms(&mut c, "/api/v1/consumer-groups/lagging?minLagSeconds=60").await,
        dlq_ms: median_ms(&mut c, &format!("/api/v1/dlq?limit=100&queue={queue}")).await,
        trace_names_ms: median_ms(&mut c, "/api/v1/traces/names?limit=50").await,
    }
}
