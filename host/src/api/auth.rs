//! Who is calling. `--auth none` (the self-hosted default) treats every caller as the
//! `default` tenant; `--auth token` accepts one static bearer token; `--auth keys` maps
//! multi-tenant API keys (stored as blake3 hashes) to their tenants.

use std::sync::Arc;

use warp::Filter;

use super::error::ApiError;
use super::AppState;

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

/// Compares in time independent of where the strings differ.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (blake3::hash(a.as_bytes()), blake3::hash(b.as_bytes()));
    a == b
}

/// Resolves the caller of a request from its `Authorization` header.
pub async fn authenticate(state: &AppState, header: Option<&str>) -> Result<Caller, ApiError> {
    let token = bearer(header);
    match &state.config.auth {
        AuthMode::None => Ok(Caller {
            tenant: DEFAULT_TENANT.into(),
        }),
        AuthMode::Token(expected) => match token {
            Some(t) if constant_time_eq(t, expected) => Ok(Caller {
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

/// A filter that yields the authenticated caller or rejects with 401.
pub fn caller(state: Arc<AppState>) -> impl Filter<Extract = (Caller,), Error = warp::Rejection> + Clone {
    warp::header::optional::<String>("authorization").and_then(move |header: Option<String>| {
        let state = state.clone();
        async move {
            authenticate(&state, header.as_deref())
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
}
