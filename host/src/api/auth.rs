//! Who is calling. `--auth none` (the self-hosted default) treats every caller as the
//! `default` tenant; `--auth token` accepts one static bearer token; `--auth keys` maps
//! multi-tenant API keys (stored as blake3 hashes) to their tenants. A request without an
//! `Authorization` header may instead carry a dashboard session cookie (see
//! [`super::session`]).

use std::sync::Arc;

use warp::http::header::AUTHORIZATION;
use warp::http::{HeaderMap, Method};
use warp::Filter;

use super::error::ApiError;
use super::{session, AppState};

/// How callers authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// No credentials; one tenant.
    None,
    /// One static bearer token; one tenant.
    Token(String),
    /// Per-tenant API keys.
    Keys,
}

/// The tenant every caller is under `none` and `token` auth.
pub const DEFAULT_TENANT: &str = "default";

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant all its data belongs to.
    pub tenant: String,
}

/// The stored form of an API key.
pub fn hash_key(key: &str) -> String {
    blake3::hash(key.as_bytes()).to_hex().to_string()
}

/// A new random API key.
pub fn new_key() -> String {
    format!("weft_{}", uuid::Uuid::new_v4().simple())
}

/// The token of an `Authorization: Bearer <token>` header (RFC 6750 over RFC 7235: the
/// scheme is case-insensitive, whitespace around the token is ignored). `None` when the
/// header is absent, names another scheme, or has an empty token.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether secret `given` (a token, a key, a signature) is `expected`, in time independent of
/// where they differ: both are hashed, and the hashes compared in constant time. Every
/// comparison of a secret goes through here.
pub fn secrets_match(given: &str, expected: &str) -> bool {
    blake3::hash(given.as_bytes()) == blake3::hash(expected.as_bytes())
}

/// Resolves the caller of a request from its `Authorization` header.
pub async fn authenticate(state: &AppState, header: Option<&str>) -> Result<Caller, ApiError> {
    let token = bearer(header);
    match &state.config.auth {
        AuthMode::None => Ok(Caller {
            tenant: DEFAULT_TENANT.into(),
        }),
        AuthMode::Token(expected) => match token {
            Some(t) if secrets_match(t, expected) => Ok(Caller {
                tenant: DEFAULT_TENANT.into(),
            }),
            None if state.config.public_demo => Ok(Caller {
                tenant: DEFAULT_TENANT.into(),
            }),
            _ => Err(ApiError::Unauthorized),
        },
        AuthMode::Keys => match token {
            Some(t) => {
                let store = state.store.clone();
                match store.tenant_for_key(&hash_key(t)).await {
                    Ok(Some(tenant)) => Ok(Caller { tenant }),
                    Ok(None) => Err(ApiError::Unauthorized),
                    Err(e) => Err(ApiError::upstream("looking up an API key", e)),
                }
            }
            None if state.config.public_demo => Ok(Caller {
                tenant: DEFAULT_TENANT.into(),
            }),
            None => Err(ApiError::Unauthorized),
        },
    }
}

/// Whether `method` changes nothing (RFC 9110 safe methods).
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether `origin` (an `Origin` header's value) is this server's own: `--public-url`, the
/// listening address, or, with no public URL set, `http://` plus the `Host` the request
/// reached; or one the operator allowed with `--allowed-origin`.
fn is_own_origin(state: &AppState, headers: &HeaderMap, origin: &str) -> bool {
    if origin == state.links.origin() || state.config.allowed_origins.iter().any(|o| o == origin) {
        return true;
    }
    state.config.public_url.is_none()
        && headers
            .get("host")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|host| origin == format!("http://{host}"))
}

/// Whether a request comes from a page of this server (or an allowed origin): the browser
/// says `Sec-Fetch-Site: same-origin` (it compares the exact scheme, host and port of the
/// page and the request, and a page cannot forge the header), or its `Origin` is one of
/// those.
pub fn is_same_origin(state: &AppState, headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("sec-fetch-site") == Some("same-origin")
        || header("origin").is_some_and(|o| is_own_origin(state, headers, o))
}

/// Whether a request that carries a session cookie may use it. A browser attaches the
/// cookie to requests made by any page of the same *site*, other ports included, and a
/// WebSocket upgrade or an event stream is not held back by the same-origin policy; so a
/// cookie counts only for:
/// - a request from this server's own pages or an allowed origin ([`is_same_origin`]);
/// - a read without an `Origin`, unless the browser says another site or origin made it,
///   apart from a top-level navigation (whose answer only the user sees). A client that is
///   not a browser sends neither header and may read with the cookie it holds.
pub fn cookie_allowed(state: &AppState, method: &Method, headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if is_same_origin(state, headers) {
        return true;
    }
    if header("origin").is_some() || !is_safe(method) {
        return false;
    }
    match header("sec-fetch-site") {
        Some("same-site" | "cross-site") => header("sec-fetch-mode") == Some("navigate"),
        _ => true,
    }
}

/// Resolves the caller of a request: its bearer token when it sends an `Authorization`
/// header, else its dashboard session cookie (which must come from this server's own pages,
/// see [`cookie_allowed`]), else no credentials.
pub async fn authenticate_request(state: &AppState, method: &Method, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let authorization = headers.get(AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
    if authorization.is_none() && state.config.auth != AuthMode::None {
        if let Some(session) = session::from_headers(headers).and_then(|id| state.sessions.get(id)) {
            if !cookie_allowed(state, method, headers) {
                return Err(ApiError::Forbidden(
                    "a cookie-authenticated request must come from this server's own pages \
                     (its Origin is not this server's, nor one allowed with --allowed-origin)"
                        .into(),
                ));
            }
            return Ok(Caller { tenant: session.tenant });
        }
    }
    authenticate(state, authorization).await
}

/// A filter that yields the authenticated caller (see [`authenticate_request`]) or rejects
/// with 401 (403 for a cross-site request on a session cookie).
pub fn caller(state: Arc<AppState>) -> impl Filter<Extract = (Caller,), Error = warp::Rejection> + Clone {
    warp::method()
        .and(warp::header::headers_cloned())
        .and_then(move |method: Method, headers: HeaderMap| {
            let state = state.clone();
            async move {
                authenticate_request(&state, &method, &headers)
                    .await
                    .map_err(warp::reject::custom)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer   abc ")), Some("abc"));
        assert_eq!(bearer(Some("  BEARER abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn secrets_match_only_when_equal() {
        assert!(secrets_match("weft_abc", "weft_abc"));
        assert!(!secrets_match("weft_abd", "weft_abc"));
        assert!(!secrets_match("weft_ab", "weft_abc"));
        assert!(!secrets_match("", "weft_abc"));
    }
}
