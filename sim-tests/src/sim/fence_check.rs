//! A fenced resource and its checker: what a lock user relies on. The resource accepts a write
//! only with a token at or above the highest it has accepted (the fencing token a lock or
//! semaphore permit carries), so a holder whose permit lapsed and was taken over writes nothing.
//! Holders write with the token of each permit they were granted (acquired, renewed, or answered
//! again to a resent acquire), and a tenure is the run of permits one holder kept without a
//! break.
//!
//! Verdicts over the accepted writes, in the order the resource took them:
//! - the accepted tokens never fall (the resource's own rule; a checker that cannot see a falling
//!   token proves nothing about the next one);
//! - no token is accepted from two tenures: one permit, one holder;
//! - tenures do not interleave: once another tenure wrote, an earlier one never writes again
//!   (it would have held the resource at the same time as its successor).
//!
//! This holds for a lock (one permit). A semaphore's permits are separate resources, one per slot.

use std::collections::{BTreeMap, BTreeSet};

/// One write as the resource took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedWrite {
    /// The writer's tenure (a holder and the permits it kept without a break).
    pub tenure: String,
    pub token: i64,
    pub accepted: bool,
}

/// A resource that refuses a token below the highest it has accepted, recording every write.
#[derive(Clone, Debug, Default)]
pub struct FencedResource {
    highest: Option<i64>,
    pub writes: Vec<FencedWrite>,
}

impl FencedResource {
    /// Writes with `token` for `tenure`: whether the resource accepted it.
    pub fn write(&mut self, tenure: &str, token: i64) -> bool {
        let accepted = self.highest.is_none_or(|h| token >= h);
        if accepted {
            self.highest = Some(token);
        }
        self.writes.push(FencedWrite {
            tenure: tenure.to_string(),
            token,
            accepted,
        });
        accepted
    }
}

/// The verdicts over one resource's writes (empty: every rule held).
pub fn check_fenced(what: &str, writes: &[FencedWrite]) -> Vec<String> {
    let mut out = vec![];
    let accepted: Vec<&FencedWrite> = writes.iter().filter(|w| w.accepted).collect();
    for pair in accepted.windows(2) {
        if pair[1].token < pair[0].token {
            out.push(format!(
                "fencing: {what} accepted token {} after {}",
                pair[1].token, pair[0].token
            ));
        }
    }
    let mut by_token: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
    for w in &accepted {
        by_token.entry(w.token).or_default().insert(&w.tenure);
    }
    for (token, tenures) in by_token.iter().filter(|(_, t)| t.len() > 1) {
        out.push(format!(
            "fencing: {what} accepted token {token} from two holders: {tenures:?}"
        ));
    }
    let mut ended: BTreeSet<&str> = BTreeSet::new();
    for pair in accepted.windows(2) {
        if pair[0].tenure != pair[1].tenure {
            ended.insert(&pair[0].tenure);
            if ended.contains(pair[1].tenure.as_str()) {
                out.push(format!(
                    "fencing: {what}: {} wrote again (token {}) after another holder had \
                     written: two holders at once",
                    pair[1].tenure, pair[1].token
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_refuses_a_lower_token_and_the_checker_names_each_breach() {
        let mut r = FencedResource::default();
        assert!(r.write("a-1", 5));
        assert!(r.write("a-1", 5));
        assert!(r.write("a-1", 7), "renewed");
        assert!(r.write("b-1", 8));
        assert!(!r.write("a-1", 7), "a lapsed holder is fenced out");
        assert!(r.write("a-2", 9));
        assert_eq!(check_fenced("lock", &r.writes), Vec::<String>::new());

        let w = |tenure: &str, token: i64| FencedWrite {
            tenure: tenure.into(),
            token,
            accepted: true,
        };
        let v = check_fenced("lock", &[w("a", 5), w("b", 5)]);
        assert!(v.iter().any(|m| m.contains("two holders:")), "{v:?}");
        let v = check_fenced("lock", &[w("a", 5), w("b", 6), w("a", 7)]);
        assert!(v.iter().any(|m| m.contains("two holders at once")), "{v:?}");
        let v = check_fenced("lock", &[w("a", 6), w("b", 5)]);
        assert!(v.iter().any(|m| m.contains("after 6")), "{v:?}");
    }
}
