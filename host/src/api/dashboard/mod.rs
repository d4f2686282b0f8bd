//! The web dashboard: server-rendered pages with a little JavaScript, all embedded in the
//! binary. `/` lists jobs; `/ui/jobs/{id}`, `/ui/submit`, `/ui/nodes` and `/ui/operator`
//! are the other pages; `/login` and `/logout` manage the session cookie; `/ui/feed` is
//! the jobs list's live stream. Every page escapes what it shows and is sent with a strict
//! Content-Security-Policy (no inline script or style). The pages' scripts call the v2 job
//! API with the session cookie.
//!
//! Public face: [`routes`].

use std::sync::Arc;

use warp::filters::BoxedFilter;
use warp::http::{HeaderMap, HeaderValue, StatusCode};
use warp::{Filter, Reply};

use super::session::{self, SessionInfo};
use super::{auth, AppState, AuthMode};

mod feed;
mod html;
mod login;
mod pages;

/// The policy of every dashboard response: scripts and styles only from this server, images
/// and media also from `data:`/`blob:` (previews) and the server's own content links.
fn content_security_policy(state: &AppState) -> String {
    let origin = state.links.origin();
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob: {origin}; \
         media-src 'self' blob: {origin}; connect-src 'self' {origin}; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'"
    )
}

/// Adds the security headers to a dashboard response.
fn secure(state: &AppState, mut response: warp::reply::Response) -> warp::reply::Response {
    let headers = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&content_security_policy(state)) {
        headers.insert("content-security-policy", csp);
    }
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    response
}

/// Who is looking at a page: a session, a bearer credential, or anyone under `--auth none`.
async fn viewer(state: &AppState, headers: &HeaderMap) -> Option<SessionInfo> {
    if state.config.auth == AuthMode::None {
        return Some(SessionInfo {
            tenant: auth::DEFAULT_TENANT.into(),
            operator: true,
        });
    }
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    if authorization.is_none() {
        if let Some(session) = session::from_headers(headers).and_then(|id| state.sessions.get(id)) {
            // A page or the live feed, fetched by another origin's script, shows nothing.
            return auth::cookie_allowed(state, &warp::http::Method::GET, headers).then_some(session);
        }
    }
    auth::authenticate(state, authorization)
        .await
        .ok()
        .map(|caller| SessionInfo {
            tenant: caller.tenant,
            operator: false,
        })
}

/// A redirect (303) to `location`.
fn see_other(location: &str) -> warp::reply::Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert("location", value);
    }
    response
}

/// The embedded static files.
fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "dashboard.js" => Some((include_str!("static/dashboard.js"), "text/javascript; charset=utf-8")),
        "dashboard.css" => Some((include_str!("static/dashboard.css"), "text/css; charset=utf-8")),
        _ => None,
    }
}

/// The dashboard routes, at the server's root.
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let with = crate::api::with_state(&state);
    let statics = warp::path!("ui" / "static" / String)
        .and(warp::get())
        .and(with.clone())
        .and_then(|name: String, state: Arc<AppState>| async move {
            match asset(&name) {
                Some((body, content_type)) => {
                    let response = warp::reply::with_header(body, "content-type", content_type).into_response();
                    Ok(secure(&state, response))
                }
                None => Err(warp::reject::not_found()),
            }
        });
    let login = login::routes(state.clone());
    // The pages: each needs a viewer, or sends the browser to log in and come back.
    let pages = warp::get()
        .and(warp::path::full())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::header::headers_cloned())
        .and(with.clone())
        .and_then(
            |path: warp::path::FullPath, query: String, headers: HeaderMap, state: Arc<AppState>| async move {
                let path = path.as_str().to_string();
                let Some(page) = pages::Page::parse(&path) else {
                    return Err(warp::reject::not_found());
                };
                let Some(viewer) = viewer(&state, &headers).await else {
                    if matches!(page, pages::Page::Feed) {
                        return Ok(super::error::ApiError::Unauthorized.into_response());
                    }
                    let mut next = path.clone();
                    if !query.is_empty() {
                        next = format!("{next}?{query}");
                    }
                    let target = format!(
                        "/login?next={}",
                        url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
                    );
                    return Ok(secure(&state, see_other(&target)));
                };
                let response = match page {
                    pages::Page::Feed => feed::stream(&state, &viewer),
                    page => pages::render(&state, &viewer, page, &query).await,
                };
                Ok(secure(&state, response))
            },
        );
    statics.or(login).unify().or(pages).unify().boxed()
}
