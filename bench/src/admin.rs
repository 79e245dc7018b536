//! The admin totals at scale (run after each partition-scaling size, so the database then holds
//! every partition of the sizes so far): what a pass over every partition costs, and what the
//! totals routes cost answered from its snapshot, against that pass.

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

pub async fn measure(addr: std::net::SocketAddr) -> AdminTimes {
    let mut c = Client::connect(addr).await;
    let r = c.send("POST", "/api/v1/stats/refresh", None).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    AdminTimes {
        partitions: v["partitions"].as_f64().unwrap_or(f64::NAN),
        pass_ms: v["tookMs"].as_f64().unwrap_or(f64::NAN),
        listing_ms: median_ms(&mut c, "/api/v1/resources/queues").await,
        groups_ms: median_ms(&mut c, "/api/v1/consumer-groups").await,
        overview_ms: median_ms(&mut c, "/api/v1/resources/overview").await,
    }
}
