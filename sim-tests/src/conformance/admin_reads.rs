//! The admin plane's reads: partition pages and lookups by id, the stored totals' pass,
//! messages counted by creation time.

use queen_core::storage::PushOutcome;
use queen_core::types::QUEUE_MODE_GROUP;

use super::{e, push, Backend, CaseResult};
use crate::fixtures::{pop_req, Ids};

/// The admin plane's partition reads: pages by bytewise name after a name, with every cursor or
/// one group's; by id in (queue, name) order, leaving out ids of no partition.
pub async fn partition_views_page_and_by_id(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(95);
    let mut pid = std::collections::BTreeMap::new();
    for p in ["c", "a", "b"] {
        let out = push(&*s, &mut ids, "iv", p, "t", 0..2).await?;
        let Some(PushOutcome::Queued { partition_id, .. }) = out.first() else {
            return Err(format!("push to {p}: {out:?}"));
        };
        pid.insert(p, partition_id.clone());
    }
    for g in ["g", QUEUE_MODE_GROUP] {
        let w = ids.worker();
        s.pop_partition(pop_req("iv", g, w, 1), "b".into())
            .await
            .map_err(e)?;
    }
    let names = |v: &[queen_core::storage::PartitionView]| -> Vec<String> {
        v.iter().map(|p| p.partition.clone()).collect()
    };
    let first = s
        .partition_views_page("iv", None, 2, None)
        .await
        .map_err(e)?;
    ensure_eq!(names(&first), vec!["a", "b"], "first page");
    let groups: Vec<&str> = first[1].cursors.iter().map(|c| c.group.as_str()).collect();
    ensure_eq!(groups, vec![QUEUE_MODE_GROUP, "g"], "every cursor on b");
    let rest = s
        .partition_views_page("iv", Some("b"), 2, None)
        .await
        .map_err(e)?;
    ensure_eq!(names(&rest), vec!["c"], "the page after b");
    let of_g = s
        .partition_views_page("iv", Some("a"), 1, Some("g"))
        .await
        .map_err(e)?;
    let groups: Vec<&str> = of_g[0].cursors.iter().map(|c| c.group.as_str()).collect();
    ensure_eq!(groups, vec!["g"], "g's cursor only");
    let asked = vec![
        pid["c"].clone(),
        "not-a-uuid".to_string(),
        pid["a"].clone(),
        uuid::Uuid::from_u128(7).to_string(),
        pid["c"].clone(),
    ];
    let found = s.partition_views_by_id(&asked).await.map_err(e)?;
    ensure_eq!(names(&found), vec!["a", "c"], "by id");
    ensure_eq!(
        (found[0].last_offset, found[0].partition_id.clone()),
        (1, pid["a"].clone()),
        "a's view"
    );
    // The whole queue in one read holds what its pages hold (leases, every cursor, a partition
    // no group read), in any order.
    let mut whole = vec![];
    let seen = s
        .each_partition_of("iv", &mut |p| whole.push(p))
        .await
        .map_err(e)?;
    whole.sort_by(|a, b| a.partition.cmp(&b.partition));
    let paged = s
        .partition_views_page("iv", None, 100, None)
        .await
        .map_err(e)?;
    ensure_eq!(seen, 3, "partitions the whole read counted");
    ensure_eq!(whole, paged, "the whole queue against its pages");
    let mut none = 0;
    let seen = s
        .each_partition_of("no-such-queue", &mut |_| none += 1)
        .await
        .map_err(e)?;
    ensure_eq!((seen, none), (0, 0), "a queue that does not exist");
    // Several queues in one read hold what each queue's own read holds, each partition with its
    // queue's place in the list; a queue that does not exist has none.
    push(&*s, &mut ids, "iv2", "x", "t", 0..3).await?;
    let asked = ["iv2", "no-such-queue", "iv"].map(String::from);
    let mut together = vec![];
    let counts = s
        .each_partition_of_queues(&asked, &mut |at, p| together.push((at, p)))
        .await
        .map_err(e)?;
    together.sort_by(|a, b| (a.0, &a.1.partition).cmp(&(b.0, &b.1.partition)));
    let mut alone = vec![];
    for (at, q) in asked.iter().enumerate() {
        let mut of_q = vec![];
        s.each_partition_of(q, &mut |p| of_q.push((at, p)))
            .await
            .map_err(e)?;
        of_q.sort_by(|a, b| a.1.partition.cmp(&b.1.partition));
        alone.extend(of_q);
    }
    ensure_eq!(
        counts,
        vec![1, 0, 3],
        "partitions of each queue read together"
    );
    ensure_eq!(together, alone, "queues read together against each alone");
    Ok(())
}

/// The admin totals' stored pass: the later of two stays whatever order they are stored in, and
/// a broker holding a pass reads a body only when a newer one is stored.
pub async fn stored_totals_keep_the_later_pass(b: &dyn Backend) -> CaseResult {
    use queen_core::storage::StoredTotals;
    use queen_core::Timestamp;
    let s = b.storage();
    ensure_eq!(
        s.stored_totals(None).await.map_err(e)?,
        None,
        "none stored yet"
    );
    let pass = |secs: i64, body: &[u8]| StoredTotals {
        taken_at: Timestamp(1_700_000_000_000_000 + secs * 1_000_000),
        body: body.to_vec(),
    };
    s.store_totals(&pass(10, b"second")).await.map_err(e)?;
    s.store_totals(&pass(5, b"first, finished last"))
        .await
        .map_err(e)?;
    ensure_eq!(
        s.stored_totals(None).await.map_err(e)?,
        Some(pass(10, b"second")),
        "an earlier pass does not replace a later one"
    );
    s.store_totals(&pass(20, b"third")).await.map_err(e)?;
    ensure_eq!(
        s.stored_totals(Some(pass(10, b"").taken_at))
            .await
            .map_err(e)?,
        Some(pass(20, b"third")),
        "newer than the pass held"
    );
    ensure_eq!(
        s.stored_totals(Some(pass(20, b"").taken_at))
            .await
            .map_err(e)?,
        None,
        "nothing newer than the pass held"
    );
    Ok(())
}

/// Messages by creation time (the analytics route): counted per queue and per interval where they
/// are stored, a queue alone when asked, the window's end excluded.
pub async fn messages_created_per_interval(b: &dyn Backend) -> CaseResult {
    use queen_core::Timestamp;
    let s = b.storage();
    let mut ids = Ids::new(97);
    push(&*s, &mut ids, "an1", "p", "t", 0..3).await?;
    b.advance_secs(3600).await;
    push(&*s, &mut ids, "an1", "p", "u", 0..2).await?;
    push(&*s, &mut ids, "an2", "p", "t", 0..1).await?;
    // 1970 to the year 3000: every message of the case.
    let (from, to) = (Timestamp(0), Timestamp(32_503_680_000_000_000));
    let all = s.messages_created(from, to, 3600, None).await.map_err(e)?;
    let mine: Vec<_> = all
        .iter()
        .filter(|c| c.queue == "an1" || c.queue == "an2")
        .collect();
    let shape: Vec<(&str, u64)> = mine
        .iter()
        .map(|c| (c.queue.as_str(), c.messages))
        .collect();
    ensure_eq!(
        shape,
        vec![("an1", 3), ("an1", 2), ("an2", 1)],
        "per queue and hour"
    );
    ensure_eq!(
        mine[1].bucket.0 - mine[0].bucket.0,
        3_600_000_000,
        "an1's two pushes an hour apart, in consecutive hours"
    );
    ensure!(
        mine.iter().all(|c| c.bucket.0 % 3_600_000_000 == 0),
        "intervals start at multiples of their width: {mine:?}"
    );
    ensure_eq!(
        mine[2].bucket,
        mine[1].bucket,
        "an2's push in an1's second hour"
    );
    let one = s
        .messages_created(from, to, 60, Some("an2"))
        .await
        .map_err(e)?;
    let shape: Vec<(&str, u64)> = one.iter().map(|c| (c.queue.as_str(), c.messages)).collect();
    ensure_eq!(shape, vec![("an2", 1)], "an2 alone, per minute");
    let before = s
        .messages_created(from, mine[1].bucket, 3600, Some("an1"))
        .await
        .map_err(e)?;
    let shape: Vec<u64> = before.iter().map(|c| c.messages).collect();
    ensure_eq!(
        shape,
        vec![3],
        "a window ending where the second hour starts"
    );
    Ok(())
}
