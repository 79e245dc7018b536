//! Ephemeral queues' storage: declarations, and which broker owns a queue, on every backend.

use queen_core::ephemeral::ownership::TAKEOVER_AFTER_MS;
use queen_core::storage::{EphemeralBroker, EphemeralClaim};
use serde_json::json;

use super::{e, Backend, CaseResult};

/// A declaration is kept, replaced, listed by name and forgotten.
pub async fn ephemeral_declarations_round_trip(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    ensure_eq!(s.ephemeral_config("e1").await.map_err(e)?, None, "step 1");
    s.save_ephemeral_config("e2", &json!({"maxLength": 2}))
        .await
        .map_err(e)?;
    s.save_ephemeral_config("e1", &json!({"maxLength": 5}))
        .await
        .map_err(e)?;
    s.save_ephemeral_config("e1", &json!({"maxLength": 6, "policy": "drop_oldest"}))
        .await
        .map_err(e)?;
    ensure_eq!(
        s.ephemeral_config("e1").await.map_err(e)?,
        Some(json!({"maxLength": 6, "policy": "drop_oldest"})),
        "step 2"
    );
    let names: Vec<String> = s
        .ephemeral_configs()
        .await
        .map_err(e)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    ensure_eq!(names, vec!["e1".to_string(), "e2".to_string()], "step 3");
    ensure_eq!(
        s.remove_ephemeral_config("e1").await.map_err(e)?,
        true,
        "step 4"
    );
    ensure_eq!(
        s.remove_ephemeral_config("e1").await.map_err(e)?,
        false,
        "step 5"
    );
    ensure_eq!(s.ephemeral_config("e1").await.map_err(e)?, None, "step 6");
    Ok(())
}

fn claim(incarnation: u64, address: &str, epoch: i64) -> EphemeralClaim {
    EphemeralClaim {
        owner: broker(incarnation, address),
        epoch,
    }
}

fn broker(incarnation: u64, address: &str) -> EphemeralBroker {
    EphemeralBroker {
        incarnation,
        address: address.to_string(),
    }
}

/// The first claim owns a queue while its broker is alive; a claim after the owner's liveness
/// ran out takes it, and each change of hands moves the epoch; a broker that left is not alive.
/// Incarnations use all 64 bits.
pub async fn ephemeral_owners_claim_and_move(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let (one, two) = (u64::MAX - 1, 2u64);
    s.ephemeral_heartbeat(one, "a:1", 5000).await.map_err(e)?;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 7"
    );
    ensure_eq!(
        s.ephemeral_claim("q", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 8"
    );
    ensure_eq!(
        s.ephemeral_claim("r", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(two, "b:2", 1),
        "step 9"
    );
    let mut alive = s.ephemeral_brokers().await.map_err(e)?;
    alive.sort_by_key(|b| b.incarnation);
    ensure_eq!(
        alive,
        vec![broker(two, "b:2"), broker(one, "a:1")],
        "step 10"
    );
    b.advance_secs(3).await;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    b.advance_secs(3).await;
    // One's liveness ran out at 5 s: two takes q; r stays two's.
    ensure_eq!(
        s.ephemeral_claim("q", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(two, "b:2", 2),
        "step 11"
    );
    ensure_eq!(
        s.ephemeral_claim("q", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(two, "b:2", 2),
        "step 12"
    );
    ensure_eq!(
        s.ephemeral_brokers().await.map_err(e)?,
        vec![broker(two, "b:2")],
        "step 13"
    );
    // Two leaves: one, renewed, takes both.
    s.ephemeral_leave(two).await.map_err(e)?;
    s.ephemeral_heartbeat(one, "a:9", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:9", 3),
        "step 14"
    );
    ensure_eq!(
        s.ephemeral_claim("r", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:9", 2),
        "step 15"
    );
    // A claimer that never renewed, of a queue nobody alive owns: refused, to be tried again.
    s.ephemeral_leave(one).await.map_err(e)?;
    ensure!(
        s.ephemeral_claim("q", 77, TAKEOVER_AFTER_MS).await.is_err(),
        "step 16"
    );
    Ok(())
}

/// After an outage of the database longer than a broker's liveness, every broker's liveness has
/// run out. A broker back first takes none of another's queues until it has been alive for
/// `TAKEOVER_AFTER_MS` without a break, so an owner that renews meanwhile keeps them under the
/// same epoch (and their rings). A claimer alive throughout takes a lapsed owner's queue at once;
/// anyone takes the queue of an owner that left at once. With 0 (the switch
/// `take_over_at_once`) the first claimer back takes it.
pub async fn ephemeral_takeover_waits_for_an_unbroken_liveness(b: &dyn Backend) -> CaseResult {
    let s = b.storage();
    let (one, two) = (11u64, 12u64);
    s.ephemeral_heartbeat(one, "a:1", 5000).await.map_err(e)?;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    for q in ["q", "r"] {
        ensure_eq!(
            s.ephemeral_claim(q, one, TAKEOVER_AFTER_MS)
                .await
                .map_err(e)?,
            claim(one, "a:1", 1),
            "step 1"
        );
    }
    // The outage: nobody renews for 6 s. Two is back first, and is refused q.
    b.advance_secs(6).await;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 2: a claimer back from the outage takes nothing over yet"
    );
    // With the switch, it would have taken r.
    ensure_eq!(
        s.ephemeral_claim("r", two, 0).await.map_err(e)?,
        claim(two, "b:2", 2),
        "step 3: taken at once with 0"
    );
    // One renews: it keeps q under the same epoch.
    s.ephemeral_heartbeat(one, "a:1", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 4"
    );
    // Both renew through the next 6 s, then one stops: two, alive throughout, takes q once
    // one's liveness ran out.
    for _ in 0..2 {
        b.advance_secs(3).await;
        s.ephemeral_heartbeat(one, "a:1", 5000).await.map_err(e)?;
        s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    }
    b.advance_secs(3).await;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 5: one's liveness still runs"
    );
    b.advance_secs(3).await;
    s.ephemeral_heartbeat(two, "b:2", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", two, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(two, "b:2", 2),
        "step 6: a claimer alive throughout takes a lapsed owner's queue"
    );
    // A broker just started takes the queue of one that left at once, not of one that lapsed.
    let three = 13u64;
    s.ephemeral_leave(two).await.map_err(e)?;
    s.ephemeral_heartbeat(three, "c:3", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("q", three, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(three, "c:3", 3),
        "step 7: an owner that left is taken at once"
    );
    s.ephemeral_heartbeat(one, "a:1", 5000).await.map_err(e)?;
    ensure_eq!(
        s.ephemeral_claim("p", one, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(one, "a:1", 1),
        "step 8"
    );
    for _ in 0..2 {
        b.advance_secs(3).await;
        s.ephemeral_heartbeat(three, "c:3", 5000).await.map_err(e)?;
    }
    ensure_eq!(
        s.ephemeral_claim("p", three, TAKEOVER_AFTER_MS)
            .await
            .map_err(e)?,
        claim(three, "c:3", 2),
        "step 9: three, alive since step 7 (6 s), takes p once one lapsed"
    );
    Ok(())
}
