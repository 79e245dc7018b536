//! The route table (`queen_server::routes::ROUTES`) is the one list of routes: every route is
//! reachable (no earlier pattern shadows it), and docs/operations.md's route list is rendered
//! from it. The auth matrix (`auth.rs`) checks every route's level against it.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use hyper::Method;
use queen_server::http::auth::Access;
use queen_server::routes::{find, Verb, ROUTES};

fn method(verb: Verb) -> Method {
    Method::from_bytes(verb.as_str().as_bytes()).unwrap()
}

/// A path the pattern matches, each parameter filled with its own name.
fn sample(pattern: &str) -> Vec<String> {
    pattern
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_matches(|c| c == '{' || c == '}' || c == '*')
                .to_string()
        })
        .collect()
}

#[test]
fn every_route_is_reachable() {
    for (i, r) in ROUTES.iter().enumerate() {
        let segments = sample(r.pattern);
        let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
        let (found, _) = find(&method(r.verb), &seg).expect("a route's own path finds a route");
        assert!(
            std::ptr::eq(found, r),
            "route {i} ({} {}) is shadowed by {} {}",
            r.verb.as_str(),
            r.pattern,
            found.verb.as_str(),
            found.pattern
        );
    }
}

fn level(access: Access) -> &'static str {
    match access {
        Access::ReadOnly => "read-only",
        Access::ReadWrite => "read-write",
        Access::Admin => "admin",
    }
}

/// docs/operations.md's route list, as the table says it.
fn rendered() -> String {
    let mut out = String::from("| method | path | level | metric surface |\n|---|---|---|---|\n");
    for r in ROUTES {
        out.push_str(&format!(
            "| `{}` | `{}` | {} | `{}` |\n",
            r.verb.as_str(),
            r.pattern,
            level(r.access),
            r.surface
        ));
    }
    out
}

const BEGIN: &str = "<!-- routes: rendered from server/src/routes/mod.rs, checked by server/tests/route_table.rs -->\n";
const END: &str = "<!-- /routes -->";

#[test]
fn the_operations_guide_lists_every_route() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
    let docs = std::fs::read_to_string(path).expect("docs/operations.md");
    let start = docs
        .find(BEGIN)
        .expect("docs/operations.md marks its route list")
        + BEGIN.len();
    let end = start + docs[start..].find(END).expect("the route list ends");
    let listed = &docs[start..end];
    let expected = rendered();
    if listed != expected {
        if std::env::var_os("QUEEN_WRITE_ROUTE_LIST").is_some() {
            let updated = format!("{}{expected}{}", &docs[..start], &docs[end..]);
            std::fs::write(path, updated).expect("write docs/operations.md");
            return;
        }
        panic!(
            "docs/operations.md's route list differs from the route table; rerun with \
             QUEEN_WRITE_ROUTE_LIST=1 to write it, or paste:\n{expected}"
        );
    }
}
