//! Browser sessions of the dashboard. `/login` trades a key or token for a random session
//! id, which the browser keeps in the `weft_session` cookie; the server stores only the id's
//! hash, with its tenant and expiry. Sessions expire, `/logout` ends one, and at most
//! [`MAX_SESSIONS`] exist at once (the one closest to expiry makes room for a new one).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The session cookie's name.
pub const COOKIE: &str = "weft_session";

/// How long a session lasts after login.
pub const TTL: Duration = Duration::from_secs(12 * 3600);

/// Most sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;

/// What a session was opened as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The tenant whose jobs and assets it sees.
    pub tenant: String,
    /// Opened with the operator token: the operator page is open to it.
    pub operator: bool,
}

struct Session {
    info: SessionInfo,
    expires: Instant,
}

/// The open sessions, keyed by the hash of their id.
#[derive(Default)]
pub struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

fn key(id: &str) -> String {
    blake3::hash(id.as_bytes()).to_hex().to_string()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session as `info` and returns its id (256 random bits, hex).
    pub fn create(&self, info: SessionInfo) -> String {
        let id = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let now = Instant::now();
        let mut open = self.lock();
        if open.len() >= MAX_SESSIONS {
            open.retain(|_, s| s.expires > now);
        }
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| k.clone()) {
                open.remove(&oldest);
            }
        }
        open.insert(
            key(&id),
            Session {
                info,
                expires: now + TTL,
            },
        );
        id
    }

    /// The live session `id`; an expired one is removed.
    pub fn get(&self, id: &str) -> Option<SessionInfo> {
        let mut open = self.lock();
        let k = key(id);
        match open.get(&k) {
            Some(s) if s.expires > Instant::now() => Some(s.info.clone()),
            Some(_) => {
                open.remove(&k);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`.
    pub fn end(&self, id: &str) {
        self.lock().remove(&key(id));
    }
}

/// The session id a request's `Cookie` headers carry.
pub fn from_headers(headers: &warp::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(warp::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(from_cookie_header)
}

/// The value of the `weft_session` cookie in a `Cookie` header.
pub fn from_cookie_header(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_maps_to_its_tenant_until_it_ends() {
        let sessions = Sessions::default();
        let info = SessionInfo {
            tenant: "acme".into(),
            operator: false,
        };
        let id = sessions.create(info.clone());
        assert_eq!(sessions.get(&id), Some(info));
        assert_eq!(sessions.get("nope"), None);
        sessions.end(&id);
        assert_eq!(sessions.get(&id), None);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        assert_eq!(from_cookie_header("a=1; weft_session=xyz; b=2"), Some("xyz"));
        assert_eq!(from_cookie_header("weft_session="), None);
        assert_eq!(from_cookie_header("other=1"), None);
    }
}
