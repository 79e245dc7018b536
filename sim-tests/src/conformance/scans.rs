//! The wildcard scan's windows, drained batches, the partition walks at their boundaries, seeks
//! and group deletion.

use queen_core::claim::SubscriptionIntent;
use queen_core::params::{SubscriptionFrom, SubscriptionMode};
use queen_core::storage::{PopRequest, QueueConfig, SeekTarget, Verdict};

use super::{backlog, configure, e, push, verdict_of, Backend, CaseResult};
use crate::fixtures::{group, messages, pop_req, Ids};

/// The wildcard scan's two shapes: a window of the candidate cap from a random partition,
/// wrapping (no watermark yet), and the partitions written since the watermark in random order
/// (a caught-up group). Each drains every pending partition exactly once.
pub async fn wildcard_windows(b: &dyn Backend) -> CaseResult {
    const PARTITIONS: usize = 700; // more than the 512-candidate cap
    let s = b.storage();
    let mut ids = Ids::new(23);
    let names: Vec<String> = (0..PARTITIONS).map(|i| format!("p{i:03}")).collect();
    let groups = names
        .iter()
        .map(|p| group(&mut ids, "q", p, "old", 0..1))
        .collect();
    s.push(groups).await.map_err(e)?;
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 64,
        ..pop_req("q", "g", w, 1000)
    };
    let mut seen: Vec<String> = vec![];
    for _ in 0..PARTITIONS {
        let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
        if r.claims.is_empty() {
            break;
        }
        seen.extend(r.claims.iter().map(|c| c.partition.clone()));
    }
    seen.sort();
    ensure_eq!(
        seen,
        names,
        "every partition once, through windows that wrap"
    );
    ensure!(
        !backlog(&*s, "q", "g").await?,
        "nothing pending after the drain"
    );
    // The empty scan set the watermark. Past its slack, three partitions are written to: the
    // caught-up group finds exactly those.
    b.advance_secs(200).await;
    let fresh = ["p007", "p350", "p699"];
    for p in fresh {
        push(&*s, &mut ids, "q", p, "new", 0..1).await?;
    }
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    let mut got: Vec<&str> = r.claims.iter().map(|c| c.partition.as_str()).collect();
    got.sort();
    ensure_eq!(
        got,
        fresh.to_vec(),
        "the written partitions, from the watermark"
    );
    Ok(())
}

/// A batch says whether it drained its partition (the ring then stops offering it): never when it
/// ends inside a segment or when another segment, visible or delayed, lies past it.
pub async fn drained_batches(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(31);
    let outcome = |r: &queen_core::storage::PopResult, p: &str| match verdict_of(r, p) {
        Some(Verdict::Took { count, drained, .. }) => Ok((count, drained)),
        other => Err(format!("{p}: expected a claim, got {other:?}")),
    };
    let auto = |w, batch| PopRequest {
        auto_ack: true,
        ..pop_req("q", "g", w, batch)
    };
    // (pushes before the pop, its batch, (count, drained), why)
    type Step<'a> = (
        &'a [(&'a str, std::ops::Range<u32>)],
        u32,
        (u32, bool),
        &'a str,
    );
    let steps: [Step; 4] = [
        (
            &[("a", 0..3)],
            2,
            (2, false),
            "a batch ending inside a segment",
        ),
        (&[], 5, (1, true), "the rest of the segment"),
        (
            &[("b", 0..2), ("c", 0..2)],
            2,
            (2, false),
            "a segment lies past the batch",
        ),
        (&[], 10, (2, true), "the last segment"),
    ];
    for (pushes, batch, expected, why) in steps {
        for (prefix, range) in pushes {
            push(&*s, &mut ids, "q", "p", prefix, range.clone()).await?;
        }
        let r = s
            .pop_partition(auto(ids.worker(), batch), "p".into())
            .await
            .map_err(e)?;
        ensure_eq!(outcome(&r, "p")?, expected, "{why}");
    }
    push(&*s, &mut ids, "q", "p2", "d", 0..1).await?;
    let r = s
        .pop_list(pop_req("q", "g", ids.worker(), 10), vec!["p2".into()])
        .await
        .map_err(e)?;
    ensure_eq!(outcome(&r, "p2")?, (1, true), "a leased batch says it too");
    configure(
        &*s,
        QueueConfig {
            delayed_processing_secs: 5,
            ..QueueConfig::with_defaults("d")
        },
    )
    .await?;
    push(&*s, &mut ids, "d", "p", "x", 0..1).await?;
    b.advance_secs(6).await;
    push(&*s, &mut ids, "d", "p", "y", 0..1).await?;
    let r = s
        .pop_list(
            PopRequest {
                auto_ack: true,
                skip_window_debounce: true,
                conflation: false,
                ..pop_req("d", "g", ids.worker(), 10)
            },
            vec!["p".into()],
        )
        .await
        .map_err(e)?;
    ensure_eq!(
        outcome(&r, "p")?,
        (1, false),
        "a delayed segment lies past the batch"
    );
    Ok(())
}

/// The partition walks at their boundaries: a group's first contact seeds every cursor of a queue
/// of FIRST_CONTACT_SEED_CAP partitions and none of a queue of one more, whose cursors are made
/// at their first claim by the same rule: a new-only group skips the backlog and reads each new
/// message once on both sides. The walk pages by bytewise name through pages one short of,
/// exactly at and one past the partition count.
pub async fn windowing_boundaries(b: &dyn Backend) -> CaseResult {
    let cap = queen_core::claim::FIRST_CONTACT_SEED_CAP;
    walk_and_drain_new_only(b, "seeded", cap).await?;
    walk_and_drain_new_only(b, "lazy", cap + 1).await
}

async fn walk_and_drain_new_only(b: &dyn Backend, queue: &str, partitions: usize) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(37);
    // Upper case, punctuation and a multi-byte first letter: bytewise order is not a locale's.
    let mut names: Vec<String> = (0..partitions)
        .map(|i| match i % 4 {
            0 => format!("p{i}"),
            1 => format!("P{i}"),
            2 => format!("p-{i}"),
            _ => format!("\u{e9}{i}"),
        })
        .collect();
    let pushes = |ids: &mut Ids, prefix: &str| {
        names
            .iter()
            .map(|p| group(ids, queue, p, prefix, 0..1))
            .collect::<Vec<_>>()
    };
    s.push(pushes(&mut ids, "old")).await.map_err(e)?;
    b.advance_secs(2).await;
    let new_only = SubscriptionIntent {
        mode: SubscriptionMode::New,
        from: SubscriptionFrom::Unset,
    };
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 64,
        intent: new_only,
        ..pop_req(queue, "g", w, 1000)
    };
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "{queue}: first contact of a new-only group skips the backlog: {:?}",
        r.verdicts
    );
    b.advance_secs(2).await;
    s.push(pushes(&mut ids, "new")).await.map_err(e)?;
    names.sort();
    for limit in [partitions - 1, partitions, partitions + 1, 100] {
        let mut walked: Vec<String> = vec![];
        loop {
            let page = s
                .pending_partitions(queue, "g", walked.last().map(String::as_str), limit as u32)
                .await
                .map_err(e)?;
            let full = page.len() == limit;
            walked.extend(page);
            if !full {
                break;
            }
        }
        ensure_eq!(walked, names, "{queue}: the walk in pages of {limit}");
    }
    // Drained as the ring drains it: pending pages, each popped as a list.
    let mut delivered: Vec<(String, String)> = vec![];
    for _ in 0..partitions {
        let page = s
            .pending_partitions(queue, "g", None, 64)
            .await
            .map_err(e)?;
        if page.is_empty() {
            break;
        }
        let r = s.pop_list(auto(ids.worker()), page).await.map_err(e)?;
        ensure!(!r.claims.is_empty(), "a pending page yields claims");
        for c in &r.claims {
            let txids = messages(&queen_core::storage::PopResult {
                claims: vec![c.clone()],
                verdicts: vec![],
                stored_conflation: None,
            });
            delivered.extend(
                txids
                    .into_iter()
                    .map(|m| (c.partition.clone(), m.frame.transaction_id)),
            );
        }
    }
    delivered.sort();
    let expected: Vec<(String, String)> = names
        .iter()
        .map(|p| (p.clone(), "new-0".to_string()))
        .collect();
    ensure_eq!(
        delivered,
        expected,
        "{queue}: every partition's new message once, none of the backlog"
    );
    Ok(())
}

/// Seek to a timestamp replays, seek to the end skips, deleting a group starts it over.
pub async fn seek_and_group_deletion(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let d = b.storage();
    let mut ids = Ids::new(19);
    push(&*s, &mut ids, "q", "a", "old", 0..2).await?;
    push(&*s, &mut ids, "q", "b", "old", 0..1).await?;
    b.advance_secs(10).await;
    let auto = |w| PopRequest {
        auto_ack: true,
        max_partitions: 10,
        ..pop_req("q", "g", w, 100)
    };
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(r.message_count(), 3, "consumed everything");
    let before = r
        .claims
        .iter()
        .flat_map(|c| c.rows.iter().map(|x| x.created_at))
        .min()
        .ok_or("rows")?;
    let moved = d
        .seek_group("g", "q", SeekTarget::Timestamp(before.minus_secs(1)))
        .await
        .map_err(e)?;
    ensure_eq!(moved, 2, "both touched partitions move");
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(
        r.message_count(),
        3,
        "a seek back to before the pushes replays them"
    );
    push(&*s, &mut ids, "q", "a", "new", 0..2).await?;
    d.seek_group("g", "q", SeekTarget::End).await.map_err(e)?;
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure!(
        r.claims.is_empty(),
        "a seek to the end skips what is stored"
    );
    let deleted = d.delete_group("g", Some("q"), true).await.map_err(e)?;
    ensure!(
        deleted.cursors >= 2 && deleted.subscription_records == 1,
        "deleted {deleted:?}"
    );
    let r = s.pop_wildcard(auto(ids.worker())).await.map_err(e)?;
    ensure_eq!(r.message_count(), 5, "a deleted group starts over");
    let n = d.update_subscription("g", before).await.map_err(e)?;
    ensure_eq!(n, 1, "the re-registered group's record");
    Ok(())
}
