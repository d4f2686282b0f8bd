//! Follow-up links. Every link is host-relative and already carries the mount prefix
//! (`--mount-prefix /deployment/<id>` gives `/deployment/<id>/api/v2/...`). Content links
//! of outputs are signed and expire, so they can be fetched without credentials. They are
//! absolute URLs on the server's own address (`--public-url`, or the listening address):
//! a request's `Host` header is never copied into them, so a forged `Host` cannot make the
//! server hand out signed links to another site.

use chrono::{DateTime, Utc};

/// Builds links under the mount prefix and signs content links.
#[derive(Clone)]
pub struct Links {
    /// `scheme://authority` clients reach the server at: content links are absolute URLs
    /// (the interface types them `uri`).
    origin: String,
    prefix: String,
    key: [u8; 32],
    ttl: chrono::Duration,
}

impl Links {
    /// Links on `origin` (`scheme://authority`) under `prefix` (empty, or starting with `/`),
    /// signed with `key`, valid for `ttl`.
    pub fn new(origin: &str, prefix: &str, key: [u8; 32], ttl: std::time::Duration) -> Self {
        Self {
            origin: origin.trim_end_matches('/').to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
            key,
            ttl: chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::hours(1)),
        }
    }

    /// `scheme://authority` the server is reached at.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The mount prefix (empty, or starting with `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}/api/v2{path}`.
    pub fn api(&self, path: &str) -> String {
        format!("{}/api/v2{path}", self.prefix)
    }

    /// The job's `urls`.
    pub fn job(&self, id: &str) -> serde_json::Value {
        serde_json::json!({
            "self": self.api(&format!("/jobs/{id}")),
            "events": self.api(&format!("/jobs/{id}/events")),
            "cancel": self.api(&format!("/jobs/{id}/cancel")),
        })
    }

    fn signature(&self, asset: &str, expires: i64) -> String {
        let message = format!("{asset}:{expires}");
        blake3::keyed_hash(&self.key, message.as_bytes()).to_hex()[..32].to_string()
    }

    /// A signed content link for `asset` and when it expires.
    pub fn content(&self, asset: &str) -> (String, DateTime<Utc>) {
        // Links are stable within a ten-minute window, so repeated reads of a job agree.
        let now = Utc::now().timestamp();
        let window = 600;
        let expires = (now / window + 1) * window + self.ttl.num_seconds();
        let url = format!(
            "{}{}?expires={expires}&sig={}",
            self.origin,
            self.api(&format!("/assets/{asset}/content")),
            self.signature(asset, expires)
        );
        (url, DateTime::from_timestamp(expires, 0).unwrap_or_else(Utc::now))
    }

    /// Whether `sig` is a valid, unexpired signature for `asset`.
    pub fn verify(&self, asset: &str, expires: i64, sig: &str) -> bool {
        expires >= Utc::now().timestamp() && super::auth::secrets_match(sig, &self.signature(asset, expires))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_carry_the_prefix_and_signatures_verify() {
        let links = Links::new(
            "http://h:1/",
            "/deployment/abc/",
            [7; 32],
            std::time::Duration::from_secs(3600),
        );
        assert_eq!(links.api("/jobs/1"), "/deployment/abc/api/v2/jobs/1");
        let (url, _) = links.content("a1");
        let query = url.split_once('?').unwrap().1;
        let mut expires = 0;
        let mut sig = "";
        for pair in query.split('&') {
            match pair.split_once('=').unwrap() {
                ("expires", v) => expires = v.parse().unwrap(),
                ("sig", v) => sig = v,
                _ => {}
            }
        }
        assert!(links.verify("a1", expires, sig));
        let (url, _) = links.content("a1");
        assert!(
            url.starts_with("http://h:1/deployment/abc/api/v2/assets/a1/content?"),
            "{url}"
        );
        assert!(!links.verify("a2", expires, sig));
        assert!(!links.verify("a1", 1, sig));
    }
}
