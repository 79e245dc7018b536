//! Route patterns: how a pattern of the route table matches a request's path.

use hyper::Method;

/// The methods routes answer (`OPTIONS`, a CORS preflight, is answered before routing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

#[allow(non_upper_case_globals)] // the route table writes `GET "/path"`, as HTTP does
impl Verb {
    pub const GET: Verb = Verb::Get;
    pub const POST: Verb = Verb::Post;
    pub const PUT: Verb = Verb::Put;
    pub const DELETE: Verb = Verb::Delete;

    pub fn of(method: &Method) -> Option<Verb> {
        Some(match *method {
            Method::GET => Verb::Get,
            Method::POST => Verb::Post,
            Method::PUT => Verb::Put,
            Method::DELETE => Verb::Delete,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Delete => "DELETE",
        }
    }
}

/// The parameters of `segments` (decoded, empty ones dropped) under `pattern`, or `None` when it
/// does not match. `{name}` takes one segment; a last `{name*}` takes one or more, joined by `/`.
pub fn matches(pattern: &str, segments: &[&str]) -> Option<Vec<String>> {
    let mut params = Vec::new();
    let mut rest = segments;
    for part in pattern.split('/').filter(|s| !s.is_empty()) {
        if part.starts_with('{') && part.ends_with("*}") {
            if rest.is_empty() {
                return None;
            }
            params.push(rest.join("/"));
            return Some(params);
        }
        let (first, tail) = rest.split_first()?;
        if part.starts_with('{') {
            params.push((*first).to_string());
        } else if part != *first {
            return None;
        }
        rest = tail;
    }
    rest.is_empty().then_some(params)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_bind_their_parameters() {
        assert_eq!(matches("/", &[]), Some(vec![]));
        assert_eq!(matches("/api/v1/pop", &["api", "v1", "pop"]), Some(vec![]));
        assert_eq!(matches("/api/v1/pop", &["api", "v1"]), None);
        assert_eq!(matches("/api/v1/pop", &["api", "v1", "pop", "x"]), None);
        assert_eq!(
            matches(
                "/api/v1/pop/queue/{queue}",
                &["api", "v1", "pop", "queue", "q/1"]
            ),
            Some(vec!["q/1".to_string()])
        );
        assert_eq!(
            matches(
                "/api/v1/kv/{ns}/{key*}",
                &["api", "v1", "kv", "n", "a", "b"]
            ),
            Some(vec!["n".to_string(), "a/b".to_string()])
        );
        assert_eq!(
            matches("/api/v1/kv/{ns}/{key*}", &["api", "v1", "kv", "n"]),
            None
        );
    }
}
