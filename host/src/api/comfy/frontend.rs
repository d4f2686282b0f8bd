//! ComfyUI's web editor from a directory (`weft serve --comfyui-frontend DIR`): its
//! `index.html` at `/` and its other static files by path. The files are the public
//! package's, so they are served without credentials; every API route they call takes the
//! caller as the rest of the protocol does.

use std::path::PathBuf;

use warp::filters::BoxedFilter;
use warp::http::{HeaderValue, StatusCode};
use warp::{Filter, Reply};

/// The editor's files from `dir` under `mount_prefix`. Put this filter before any other
/// that serves `/` (it rejects what `dir` does not hold, so later filters still answer).
pub fn frontend_routes(dir: PathBuf, mount_prefix: &str) -> BoxedFilter<(warp::reply::Response,)> {
    let mut base = warp::any().boxed();
    for segment in mount_prefix.split('/').filter(|s| !s.is_empty()) {
        base = base.and(warp::path(segment.to_string())).boxed();
    }
    let index = warp::path::end()
        .and(warp::get().or(warp::head()).unify())
        .and(warp::fs::file(dir.join("index.html")))
        .map(|file: warp::fs::File| {
            let mut response = file.into_response();
            // Like ComfyUI: the page is always fetched again, so a new editor takes effect.
            response
                .headers_mut()
                .insert("cache-control", HeaderValue::from_static("no-cache"));
            response
        });
    let files = warp::get()
        .or(warp::head())
        .unify()
        .and(warp::fs::dir(dir))
        .map(|file: warp::fs::File| file.into_response());
    // What the editor asks for on load that the package does not hold: the user's style
    // sheet (empty), the icon (none), and the workflow templates (none: they are another
    // package).
    let fallback = |path: &'static str, status: StatusCode, content_type: &'static str, body: &'static str| {
        warp::path(path).and(warp::path::end()).and(warp::get()).map(move || {
            let mut response = warp::reply::with_status(body, status).into_response();
            response
                .headers_mut()
                .insert("content-type", HeaderValue::from_static(content_type));
            response
        })
    };
    let templates = warp::path("templates")
        .and(warp::path("index.json"))
        .and(warp::path::end())
        .and(warp::get())
        .map(|| warp::reply::json(&serde_json::json!([])).into_response());
    base.and(
        index
            .or(files)
            .unify()
            .or(fallback("user.css", StatusCode::OK, "text/css", ""))
            .unify()
            .or(fallback("favicon.ico", StatusCode::NO_CONTENT, "image/x-icon", ""))
            .unify()
            .or(templates)
            .unify(),
    )
    .boxed()
}
