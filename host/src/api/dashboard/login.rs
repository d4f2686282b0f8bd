//! `/login` (a form that trades a key or token for a session cookie) and `/logout`.

use std::collections::HashMap;
use std::sync::Arc;

use warp::filters::BoxedFilter;
use warp::http::{HeaderMap, HeaderValue, StatusCode};
use warp::Filter;

use super::html::{self, esc};
use super::{secure, see_other};
use crate::api::session::{self, SessionInfo};
use crate::api::{auth, AppState, AuthMode};

/// Largest login form body.
const MAX_FORM_BYTES: u64 = 16 * 1024;

/// `next` when it is a path on this server (`/...`, not `//host` or `/\host`), else `/`.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.starts_with("/\\")
                && !n.chars().any(|c| c.is_control() || c == '\\') =>
        {
            n.to_string()
        }
        _ => "/".into(),
    }
}

fn form(state: &AppState, next: &str, error: Option<&str>) -> String {
    let what = match state.config.auth {
        AuthMode::Keys => "API key",
        _ => "access token",
    };
    let mut body = String::from("<section class=\"login\"><h1>Log in</h1>");
    if let Some(error) = error {
        body.push_str(&format!("<p class=\"error\" id=\"login-error\">{}</p>", esc(error)));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"/login\"><label>Your {what} \
         <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"current-password\" required autofocus></label>\
         <input type=\"hidden\" name=\"next\" value=\"{}\"><button type=\"submit\" id=\"login\">Log in</button></form>\
         <p class=\"hint\">The operator token (<code>--admin-token</code>) also logs in, and opens the operator page.</p></section>",
        esc(next)
    ));
    html::page("Log in", "login", &state.links.api(""), false, &body)
}

/// The `Set-Cookie` value of session `id` (empty and expired when `id` is empty).
fn cookie(state: &AppState, id: &str) -> String {
    let secure = state
        .config
        .public_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    let age = if id.is_empty() { 0 } else { session::TTL.as_secs() };
    format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={age}{}",
        session::COOKIE,
        if secure { "; Secure" } else { "" }
    )
}

/// The session a login key opens: the operator token opens an operator session, a key or
/// token the job API accepts one for its tenant.
async fn session_for(state: &AppState, key: &str) -> Option<SessionInfo> {
    if key.is_empty() {
        return None;
    }
    if let Some(admin) = &state.config.admin_token {
        if auth::secrets_match(key, admin) {
            return Some(SessionInfo {
                tenant: auth::DEFAULT_TENANT.into(),
                operator: true,
            });
        }
    }
    let header = format!("Bearer {key}");
    auth::authenticate(state, Some(&header))
        .await
        .ok()
        .map(|caller| SessionInfo {
            tenant: caller.tenant,
            operator: false,
        })
}

async fn post_login(
    state: &AppState,
    client: Option<crate::api::ClientAddr>,
    headers: &HeaderMap,
    form_body: HashMap<String, String>,
) -> warp::reply::Response {
    let next = safe_next(form_body.get("next").map(String::as_str));
    if !auth::is_same_origin(state, headers) {
        return html::response(
            StatusCode::FORBIDDEN,
            form(
                state,
                &next,
                Some("This login did not come from this server's own page."),
            ),
        );
    }
    if state.config.auth == AuthMode::None {
        return see_other(&next);
    }
    if let Some(client) = client {
        if let Err(wait) = state.logins.attempt(client.0.ip()) {
            let seconds = wait.as_secs().max(1);
            let mut response = html::response(
                StatusCode::TOO_MANY_REQUESTS,
                form(
                    state,
                    &next,
                    Some(&format!("Too many login attempts. Try again in {seconds} s.")),
                ),
            );
            response.headers_mut().insert("retry-after", HeaderValue::from(seconds));
            return response;
        }
    }
    let key = form_body.get("key").map(|k| k.trim()).unwrap_or("");
    let Some(info) = session_for(state, key).await else {
        return html::response(
            StatusCode::UNAUTHORIZED,
            form(state, &next, Some("That key is not valid.")),
        );
    };
    let id = state.sessions.create(info);
    let mut response = see_other(&next);
    if let Ok(value) = HeaderValue::from_str(&cookie(state, &id)) {
        response.headers_mut().insert("set-cookie", value);
    }
    response
}

fn post_logout(state: &AppState, headers: &HeaderMap) -> warp::reply::Response {
    if !auth::is_same_origin(state, headers) {
        return html::response(
            StatusCode::FORBIDDEN,
            form(
                state,
                "/",
                Some("This logout did not come from this server's own page."),
            ),
        );
    }
    if let Some(id) = session::from_headers(headers) {
        state.sessions.end(id);
    }
    let mut response = see_other("/login");
    if let Ok(value) = HeaderValue::from_str(&cookie(state, "")) {
        response.headers_mut().insert("set-cookie", value);
    }
    response
}

/// `GET`/`POST /login` and `POST /logout`.
pub(super) fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let with = crate::api::with_state(&state);
    let show = warp::path("login")
        .and(warp::path::end())
        .and(warp::get())
        .and(
            warp::query::<HashMap<String, String>>()
                .or(warp::any().map(HashMap::new))
                .unify(),
        )
        .and(with.clone())
        .map(|query: HashMap<String, String>, state: Arc<AppState>| {
            let next = safe_next(query.get("next").map(String::as_str));
            let response = if state.config.auth == AuthMode::None {
                see_other(&next)
            } else {
                html::response(StatusCode::OK, form(&state, &next, None))
            };
            secure(&state, response)
        });
    let submit = warp::path("login")
        .and(warp::path::end())
        .and(warp::post())
        .and(warp::ext::optional::<crate::api::ClientAddr>())
        .and(warp::header::headers_cloned())
        .and(warp::body::content_length_limit(MAX_FORM_BYTES))
        .and(warp::body::form::<HashMap<String, String>>())
        .and(with.clone())
        .and_then(
            |client: Option<crate::api::ClientAddr>,
             headers: HeaderMap,
             body: HashMap<String, String>,
             state: Arc<AppState>| async move {
                Ok::<_, warp::Rejection>(secure(&state, post_login(&state, client, &headers, body).await))
            },
        );
    let logout = warp::path("logout")
        .and(warp::path::end())
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(with.clone())
        .map(|headers: HeaderMap, state: Arc<AppState>| secure(&state, post_logout(&state, &headers)));
    show.or(submit).unify().or(logout).unify().boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_only_a_local_path() {
        assert_eq!(safe_next(Some("/ui/jobs/x?a=1")), "/ui/jobs/x?a=1");
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(Some("/a\nb")), "/");
        assert_eq!(safe_next(None), "/");
    }
}
