//! Reads by offset and partition discovery, on every backend.

use queen_core::frames::slice_blob;
use queen_core::reads::{ChangedPage, ChangedQuery, Retained};
use queen_core::storage::{PartitionRead, Storage};
use queen_core::Timestamp;

use super::{e, push, Backend, CaseResult};
use crate::fixtures::Ids;

/// (offset, payload n) of every record a read returned, and its range.
async fn read(
    s: &dyn Storage,
    q: &str,
    p: &str,
    offset: i64,
    hint: u64,
) -> Result<Option<(Retained, Vec<(i64, u32)>)>, String> {
    match s.read_partition(q, p, offset, hint).await.map_err(e)? {
        PartitionRead::Unknown => Ok(None),
        PartitionRead::Found { range, segments } => {
            let mut out = vec![];
            for seg in &segments {
                let frames = slice_blob(
                    &seg.blob,
                    seg.start_idx as usize,
                    seg.take as usize,
                    seg.msg_count as usize,
                )
                .map_err(e)?;
                for (i, f) in frames.iter().enumerate() {
                    let text = String::from_utf8_lossy(&f.payload);
                    let n = text
                        .trim_start_matches("{\"n\":")
                        .trim_end_matches('}')
                        .parse()
                        .unwrap_or(u32::MAX);
                    out.push((seg.base_offset + i64::from(seg.start_idx) + i as i64, n));
                }
            }
            Ok(Some((range, out)))
        }
    }
}

fn offsets(records: &[(i64, u32)]) -> Vec<i64> {
    records.iter().map(|(o, _)| *o).collect()
}

/// Reads by offset across segment boundaries, at the end, past it, after retention, and of
/// what does not exist.
pub async fn fetch_reads_by_offset(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(60);
    push(&*s, &mut ids, "rq", "p", "a", 0..3).await?;
    push(&*s, &mut ids, "rq", "p", "b", 3..5).await?;
    push(&*s, &mut ids, "rq", "p", "c", 5..9).await?;
    let (range, all) = read(&*s, "rq", "p", 0, u64::MAX).await?.ok_or("unknown")?;
    ensure_eq!(
        (range.high_watermark, range.log_start),
        (9, 0),
        "the retained range"
    );
    ensure_eq!(offsets(&all), (0..9).collect::<Vec<_>>(), "every record");
    ensure!(
        all.iter().all(|(o, n)| *o == i64::from(*n)),
        "each record at the offset it was pushed to: {all:?}"
    );
    let (_, mid) = read(&*s, "rq", "p", 4, u64::MAX).await?.ok_or("unknown")?;
    ensure_eq!(
        offsets(&mid),
        (4..9).collect::<Vec<_>>(),
        "from inside a segment"
    );
    let (_, one) = read(&*s, "rq", "p", 1, 1).await?.ok_or("unknown")?;
    ensure_eq!(
        offsets(&one),
        vec![1, 2],
        "a tiny hint reads the one segment holding the offset"
    );
    let (_, none) = read(&*s, "rq", "p", 4, 0).await?.ok_or("unknown")?;
    ensure!(none.is_empty(), "hint 0 reads the range alone");
    let (end, nothing) = read(&*s, "rq", "p", 9, u64::MAX).await?.ok_or("unknown")?;
    ensure!(
        nothing.is_empty() && !end.out_of_range(9),
        "the end reads nothing yet, and is in range"
    );
    ensure!(end.out_of_range(10), "past the end is out of range");
    let (_, past) = read(&*s, "rq", "p", 10, u64::MAX).await?.ok_or("unknown")?;
    ensure!(past.is_empty(), "past the end reads nothing");
    ensure!(
        read(&*s, "rq", "nope", 0, u64::MAX).await?.is_none(),
        "an unknown partition"
    );
    ensure!(
        read(&*s, "nope", "p", 0, u64::MAX).await?.is_none(),
        "an unknown queue"
    );
    b.drop_segments("rq", "p", 5).await;
    let (kept, rest) = read(&*s, "rq", "p", 5, u64::MAX).await?.ok_or("unknown")?;
    ensure_eq!(
        (kept.high_watermark, kept.log_start),
        (9, 5),
        "retention moved the start"
    );
    ensure_eq!(
        offsets(&rest),
        (5..9).collect::<Vec<_>>(),
        "read from the start kept"
    );
    ensure!(kept.out_of_range(2), "below the start is out of range");
    let (_, gone) = read(&*s, "rq", "p", 2, u64::MAX).await?.ok_or("unknown")?;
    ensure!(gone.is_empty(), "nothing is read below the start");
    b.drop_segments("rq", "p", 9).await;
    let (emptied, _) = read(&*s, "rq", "p", 9, u64::MAX).await?.ok_or("unknown")?;
    ensure_eq!(
        (emptied.high_watermark, emptied.log_start),
        (9, 9),
        "nothing kept: the range is empty at the end"
    );
    Ok(())
}

async fn changed(
    s: &dyn Storage,
    queue: &str,
    since: Option<Timestamp>,
    after: Option<&str>,
    limit: u32,
) -> Result<ChangedPage, String> {
    s.changed_partitions(&ChangedQuery {
        queue: queue.into(),
        since,
        after: after.map(str::to_string),
        limit,
    })
    .await
    .map_err(e)
}

fn names(page: &ChangedPage) -> Vec<String> {
    page.partitions
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect()
}

/// Discovery pages by name, filters by write time, reports the retained ranges, and its
/// `safeTime` is below the write time of everything written after it.
pub async fn partitions_changed_since(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let mut ids = Ids::new(61);
    for p in ["p1", "p3", "p2"] {
        push(&*s, &mut ids, "cq", p, p, 0..2).await?;
    }
    let all = changed(&*s, "cq", None, None, 1000).await?;
    ensure_eq!(
        names(&all),
        vec!["p1", "p2", "p3"],
        "every partition, by name"
    );
    let first = &all.partitions.as_ref().ok_or("no partitions")?[0];
    ensure_eq!(
        (first.range.high_watermark - 1, first.range.log_start),
        (1, 0),
        "lastOffset and logStart"
    );
    let page = changed(&*s, "cq", None, None, 2).await?;
    ensure!(
        names(&page) == vec!["p1", "p2"] && page.more,
        "a page of two, with more: {page:?}"
    );
    let rest = changed(&*s, "cq", None, Some("p2"), 2).await?;
    ensure!(
        names(&rest) == vec!["p3"] && !rest.more,
        "the rest: {rest:?}"
    );
    // Write times are quantized to the second, so a safeTime closes only whole seconds (a
    // partition written earlier in the second of an answer is listed again after it): move
    // past the writes' second first.
    b.advance_secs(2).await;
    let safe = changed(&*s, "cq", None, None, 1000).await?.safe_time;
    ensure!(
        changed(&*s, "cq", Some(safe), None, 1000)
            .await?
            .partitions
            .is_some_and(|p| p.is_empty()),
        "nothing written since a safeTime past the writes' second"
    );
    b.advance_secs(10).await;
    push(&*s, &mut ids, "cq", "p2", "again", 0..1).await?;
    let since = changed(&*s, "cq", Some(safe), None, 1000).await?;
    ensure_eq!(
        names(&since),
        vec!["p2"],
        "written since the first answer's safeTime"
    );
    let p2 = &since.partitions.as_ref().ok_or("no partitions")?[0];
    ensure!(
        p2.last_write_at > safe,
        "a later write's time is above the earlier safeTime: {p2:?} vs {safe:?}"
    );
    ensure!(
        since.safe_time >= safe,
        "safeTime does not go back: {since:?}"
    );
    let unknown = changed(&*s, "nope", None, None, 10).await?;
    ensure!(unknown.partitions.is_none(), "an unknown queue");
    Ok(())
}
