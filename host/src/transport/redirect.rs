//! Which redirects a POST to an HTTP server follows: one rule for reqwest's client and for the
//! kept connections (`kept.rs`).

use reqwest::redirect::Policy;
use url::Url;

/// Redirects a POST follows at most.
pub(crate) const MAX_REDIRECTS: usize = 10;

/// Whether a POST to `first` that was redirected with `status` to `next` is sent there: only
/// same-origin 307/308, since others would drop the body or hand the session id and the
/// configured headers to another host.
pub(crate) fn follows(status: http::StatusCode, first: &Url, next: &Url) -> bool {
    matches!(status.as_u16(), 307 | 308) && first.origin() == next.origin()
}

/// The rule as reqwest's client takes it.
pub(crate) fn same_origin() -> Policy {
    Policy::custom(|attempt| {
        let follows = attempt
            .previous()
            .first()
            .is_some_and(|first| follows(attempt.status(), first, attempt.url()));
        if !follows {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// Where a POST to `first`, now at `current`, goes next after `response`, if it is followed.
pub(crate) fn next(first: &Url, current: &Url, response: &reqwest::Response) -> Option<Url> {
    let location = response.headers().get(http::header::LOCATION)?.to_str().ok()?;
    let next = current.join(location).ok()?;
    follows(response.status(), first, &next).then_some(next)
}

/// The `Referer` reqwest's client sends with a redirected request: the URL redirected from,
/// without credentials or fragment.
pub(crate) fn referer(from: &Url) -> Option<http::HeaderValue> {
    let mut referer = from.clone();
    referer.set_username("").ok()?;
    referer.set_password(None).ok()?;
    referer.set_fragment(None);
    http::HeaderValue::from_str(referer.as_str()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_same_origin_307_and_308_are_followed() {
        let first = Url::parse("http://a.example/mcp").unwrap();
        let same = Url::parse("http://a.example/mcp/").unwrap();
        let other = Url::parse("http://b.example/mcp").unwrap();
        let followed = |status: u16, next: &Url| {
            follows(http::StatusCode::from_u16(status).unwrap(), &first, next)
        };
        assert!(followed(307, &same) && followed(308, &same));
        assert!(!followed(307, &other) && !followed(308, &other));
        assert!(!followed(301, &same) && !followed(302, &same) && !followed(303, &same));
    }

    #[test]
    fn the_referer_carries_no_credentials_or_fragment() {
        let from = Url::parse("http://user:secret@a.example/mcp?x=1#part").unwrap();
        assert_eq!(referer(&from).unwrap(), "http://a.example/mcp?x=1");
    }
}
