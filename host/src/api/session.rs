//! Browser sessions of the dashboard. `/login` trades a key or token for a random session
//! id, which the browser keeps in the `weft_session` cookie; the server stores only the id's
//! hash, with its tenant and expiry. Sessions expire, `/logout` ends one, a tenant holds at
//! most [`MAX_SESSIONS_PER_TENANT`] (its own oldest makes room for a new one), and at most
//! [`MAX_SESSIONS`] exist at once. Login attempts are limited per client network
//! ([`LoginLimiter`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// The session cookie's name.
pub const COOKIE: &str = "weft_session";

/// How long a session lasts after login.
pub const TTL: Duration = Duration::from_secs(12 * 3600);

/// Most sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;

/// Most sessions one tenant (or the operator) keeps at once, so that one tenant logging in
/// over and over cannot push the others' sessions out.
pub const MAX_SESSIONS_PER_TENANT: usize = 64;

/// Login attempts a client network may make at once; after them, one more every
/// [`LOGIN_REFILL`].
pub const LOGIN_BURST: u32 = 10;

/// How often a client network regains one login attempt.
pub const LOGIN_REFILL: Duration = Duration::from_secs(6);

/// Most client networks whose login attempts are tracked at once; past it (a flood from
/// very many addresses) new networks are refused until old entries lapse.
const MAX_TRACKED_NETWORKS: usize = 100_000;

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
        let mine: Vec<(&String, &Session)> = open.iter().filter(|(_, s)| s.info == info).collect();
        if mine.len() >= MAX_SESSIONS_PER_TENANT {
            if let Some(oldest) = mine.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| (*k).clone()) {
                open.remove(&oldest);
            }
        }
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

/// Login attempts per client network: [`LOGIN_BURST`] at once, then one every
/// [`LOGIN_REFILL`] (GCRA, as `governor` keeps it). A network is an IPv4 address or an IPv6
/// /64, the block one client usually holds.
pub struct LoginLimiter {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
}

impl Default for LoginLimiter {
    fn default() -> Self {
        let quota = Quota::with_period(LOGIN_REFILL)
            .expect("a non-zero period")
            .allow_burst(NonZeroU32::new(LOGIN_BURST).expect("a non-zero burst"));
        Self {
            limiter: DefaultKeyedRateLimiter::hashmap(quota),
        }
    }
}

impl LoginLimiter {
    /// Takes one login attempt for `client`; `Err` with how long to wait when its network
    /// has none left (or when too many networks are tracked to take a new one).
    pub fn attempt(&self, client: IpAddr) -> Result<(), Duration> {
        let network = match client {
            IpAddr::V4(_) => client,
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        };
        if self.limiter.len() >= MAX_TRACKED_NETWORKS {
            self.limiter.retain_recent();
            if self.limiter.len() >= MAX_TRACKED_NETWORKS {
                return Err(LOGIN_REFILL);
            }
        }
        self.limiter
            .check_key(&network)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
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
    fn one_tenant_cannot_push_out_another_tenants_sessions() {
        let sessions = Sessions::default();
        let tenant = |t: &str| SessionInfo {
            tenant: t.into(),
            operator: false,
        };
        let other = sessions.create(tenant("b"));
        let first = sessions.create(tenant("a"));
        for _ in 0..MAX_SESSIONS_PER_TENANT {
            sessions.create(tenant("a"));
        }
        assert_eq!(sessions.get(&first), None, "a's oldest session made room");
        assert_eq!(sessions.get(&other), Some(tenant("b")));
    }

    #[test]
    fn login_attempts_are_limited_per_network() {
        let limiter = LoginLimiter::default();
        let client: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..LOGIN_BURST {
            assert!(limiter.attempt(client).is_ok());
        }
        let wait = limiter.attempt("2001:db8::2".parse().unwrap()).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= LOGIN_REFILL, "{wait:?}");
        assert!(
            limiter.attempt("2001:db9::1".parse().unwrap()).is_ok(),
            "another network"
        );
        assert!(limiter.attempt("192.0.2.1".parse().unwrap()).is_ok());
    }

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
