//! The wildcard scan's own statements: a group's first contact (the seeder's election and its
//! seed), the candidate scan, and the empty-scan watermark.

use queen_core::claim::{
    seed_cursor, seed_rule, wildcard_candidate_cap, CursorRow, SubscriptionRecord,
    FIRST_CONTACT_SEED_CAP, WATERMARK_RECHECK_SECS, WATERMARK_SLACK_SECS,
};
use queen_core::storage::PopRequest;
use queen_core::{Offset, Timestamp};

use super::{CURSOR_CREATE_SEED, FIRST_CONTACT_SEED, WATERMARK_SEED};
use crate::state::{advisory_key, DbState, MetaRow, WatermarkRow};
use crate::table::{Insert, Lock};
use crate::tx::{StmtError, Tx};

/// Group first contact: the subscription record elects the seeder, which seeds every cursor of
/// a queue of at most FIRST_CONTACT_SEED_CAP partitions (none of a larger one: its cursors are
/// all made at their first claim). One step, as the procedure's statements from its partition
/// count to the seed's insert.
pub(super) fn first_contact(
    st: &mut DbState,
    t: &Tx,
    req: &PopRequest,
    mkey: &(String, String),
    now: Timestamp,
) -> Result<(), StmtError> {
    if st.metadata.get(mkey, t.id).is_some()
        || !st.try_advisory(
            advisory_key(&req.queue, &req.group, FIRST_CONTACT_SEED),
            t.id,
        )
    {
        return Ok(());
    }
    let row = MetaRow {
        subscription_timestamp: queen_core::claim::registration_timestamp(req.intent, now),
        created_at: now,
        conflation: req.conflation,
    };
    let record = SubscriptionRecord {
        subscription_timestamp: row.subscription_timestamp,
    };
    if st.metadata.insert(mkey.clone(), row, t.id) != Insert::Inserted
        || st
            .partitions_of(&req.queue, t.id)
            .nth(FIRST_CONTACT_SEED_CAP)
            .is_some()
    {
        return Ok(());
    }
    let parts: Vec<(String, String, Offset)> = st
        .partitions_of(&req.queue, t.id)
        .filter(|(_, p)| {
            st.consumers
                .get(&(p.id.clone(), req.group.clone()), t.id)
                .is_none()
        })
        .take(FIRST_CONTACT_SEED_CAP)
        .map(|(name, p)| (name.to_string(), p.id.clone(), p.last_offset))
        .collect();
    let rule = seed_rule(&req.group, Some(record), req.intent);
    for (_, pid, last_offset) in parts {
        let key = (pid.clone(), req.group.clone());
        // Set-based and non-blocking: rows another transaction is creating are left
        // to it (it holds their advisory lock).
        if st.consumers.get(&key, t.id).is_some()
            || st.consumers.locked_by_other(&key, t.id).is_some()
        {
            continue;
        }
        if !st.try_advisory(advisory_key(&pid, &req.group, CURSOR_CREATE_SEED), t.id) {
            continue;
        }
        let first_recent = match rule {
            queen_core::claim::SeedRule::FromTimestamp(ts) => st
                .segments
                .range(
                    (pid.clone(), Offset::MIN)..=(pid.clone(), Offset::MAX),
                    t.id,
                )
                .find(|(_, s)| s.created_at >= ts)
                .map(|((_, base), _)| *base),
            _ => None,
        };
        let _ = st.consumers.insert(
            key,
            CursorRow::seeded(seed_cursor(rule, last_offset, first_recent)),
            t.id,
        );
    }
    Ok(())
}

/// The candidate scan: watermark, coarse filter, lease filter, cap; a random order when few
/// partitions were written since the watermark, else a window of the cap in id order from a
/// random partition, wrapping once. `need_a_cursor`: the historical bug switch (partitions
/// without a cursor row are not pending).
pub(super) fn candidate_scan(
    st: &mut DbState,
    t: &Tx,
    req: &PopRequest,
    mkey: &(String, String),
    now: Timestamp,
    need_a_cursor: bool,
) -> Result<Vec<(String, Option<String>)>, StmtError> {
    let watermark = st.watermarks.get(mkey, t.id).map(|w| w.watermark);
    let floor = watermark
        .unwrap_or(Timestamp::EPOCH)
        .minus_secs(WATERMARK_SLACK_SECS);
    let all: Vec<_> = st.partitions_of(&req.queue, t.id).collect();
    let cap = wildcard_candidate_cap(all.len() as u64, req.max_partitions) as usize;
    let recent = all.iter().filter(|(_, p)| p.last_write_at >= floor).count();
    let few_recent = watermark.is_some_and(|w| w > Timestamp::EPOCH) && recent < cap * 4;
    let mut picked: Vec<(String, Option<String>)> = all
        .into_iter()
        .filter(|(_, p)| p.last_write_at >= floor)
        .filter(
            |(_, p)| match st.consumers.get(&(p.id.clone(), req.group.clone()), t.id) {
                None => !need_a_cursor,
                Some(c) => p.last_offset > c.committed && c.claimable(now),
            },
        )
        .map(|(name, p)| (name.to_string(), Some(p.id.clone())))
        .collect();
    if few_recent {
        st.rng.shuffle(&mut picked);
    } else {
        picked.sort_by(|a, b| a.1.cmp(&b.1));
        let start = st.rng.below(picked.len() as u64) as usize;
        picked.rotate_left(start);
    }
    picked.truncate(cap);
    Ok(picked)
}

/// The empty-scan watermark: re-checked at most every 30 s, advanced only when the queue is
/// genuinely empty for this group (a lease-held backlog keeps the floor).
pub(super) fn advance_watermark(
    st: &mut DbState,
    t: &Tx,
    req: &PopRequest,
    mkey: &(String, String),
    now: Timestamp,
) -> Result<(), StmtError> {
    let current = st.watermarks.get(mkey, t.id).cloned();
    if current
        .as_ref()
        .is_some_and(|w| now < w.last_checked.plus_secs(WATERMARK_RECHECK_SECS))
    {
        return Ok(());
    }
    if !st.try_advisory(advisory_key(&req.queue, &req.group, WATERMARK_SEED), t.id) {
        return Ok(());
    }
    let pending = st.partitions_of(&req.queue, t.id).any(|(_, p)| {
        match st.consumers.get(&(p.id.clone(), req.group.clone()), t.id) {
            None => p.last_offset >= 0,
            Some(c) => p.last_offset > c.committed,
        }
    });
    let watermark = match (&current, pending) {
        (_, false) => now,
        (Some(w), true) => w.watermark,
        (None, true) => Timestamp::EPOCH,
    };
    let row = WatermarkRow {
        watermark,
        last_checked: now,
    };
    match current {
        Some(_) => match st.watermarks.update(mkey, row, t.id) {
            Lock::HeldBy(_) | Lock::Missing | Lock::Acquired => {}
        },
        None => {
            let _ = st.watermarks.insert(mkey.clone(), row, t.id);
        }
    }
    Ok(())
}
