//! Asset routes: multipart upload (streamed to disk, hashed as it arrives, deduplicated),
//! from-hash, by-hash probe, read, delete, and content with `Range` support.

use std::sync::Arc;

use bytes::Buf;
use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use serde_json::Value as Json;
use warp::filters::multipart::{FormData, Part};
use warp::filters::BoxedFilter;
use warp::http::{HeaderValue, StatusCode};
use warp::{Filter, Reply};

use super::auth::{self, Caller};
use super::error::ApiError;
use super::{render, respond, AppState};
use crate::jobs::assets::{parse_hash, Assets, Upload, UploadDetails};

/// Bounds of `expires_in`, in seconds.
const EXPIRES_IN: std::ops::RangeInclusive<i64> = 60..=604_800;

/// The asset routes, relative to `/api/v2`.
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let with = crate::api::with_state(&state);
    let caller = auth::caller(state.clone());
    let upload = warp::path("assets")
        .and(warp::path::end())
        .and(warp::post())
        .and(with.clone())
        .and(caller.clone())
        .and(upload_limit(state.config.max_upload_bytes))
        // No length cap here: warp's cap needs a Content-Length and would refuse chunked
        // uploads. The announced length is checked above; the streamed bytes in `upload`.
        .and(warp::multipart::form().max_length(None))
        .and_then(|s, c, f| async move { respond(upload(s, c, f).await) });
    let from_hash = warp::path!("assets" / "from-hash")
        .and(warp::post())
        .and(with.clone())
        .and(caller.clone())
        .and(super::body::budgeted_body(&state))
        .and_then(|s, c, b: super::body::BudgetedBody| async move { respond(from_hash(s, c, b.bytes).await) });
    let by_hash = warp::path!("assets" / "by-hash" / String)
        .and(warp::head())
        .and(with.clone())
        .and(caller.clone())
        .and_then(|h, s, c| async move { respond(by_hash(s, c, h).await) });
    let get = warp::path!("assets" / String)
        .and(warp::get())
        .and(with.clone())
        .and(caller.clone())
        .and_then(|id, s, c| async move { respond(get(s, c, id).await) });
    let delete = warp::path!("assets" / String)
        .and(warp::delete())
        .and(with.clone())
        .and(caller.clone())
        .and_then(|id, s, c| async move { respond(delete(s, c, id).await) });
    let content = warp::path!("assets" / String / "content")
        .and(warp::get().or(warp::head()).unify())
        .and(with.clone())
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::query::<std::collections::HashMap<String, String>>())
        .and(warp::header::optional::<String>("range"))
        .and_then(|id, s, a, q, r| async move { respond(content(s, id, a, q, r).await) });
    upload
        .or(from_hash)
        .unify()
        .or(by_hash)
        .unify()
        .or(get)
        .unify()
        .or(delete)
        .unify()
        .or(content)
        .unify()
        .boxed()
}

/// Refuses, before any of the body is read, an upload whose announced length is over the
/// limit (plus room for the multipart framing and the small text parts).
pub(super) fn upload_limit(max: u64) -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and_then(move |length: Option<u64>| async move {
            match length {
                Some(n) if n > max + 64 * 1024 => Err(warp::reject::custom(ApiError::PayloadTooLarge(format!(
                    "uploads are limited to {max} bytes"
                )))),
                _ => Ok(()),
            }
        })
        .untuple_one()
}

fn reply(status: StatusCode, body: &Json) -> warp::reply::Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}

fn expires_at(expires_in: Option<i64>) -> Result<Option<chrono::DateTime<Utc>>, ApiError> {
    match expires_in {
        None => Ok(None),
        Some(secs) if EXPIRES_IN.contains(&secs) => Ok(Some(Utc::now() + chrono::Duration::seconds(secs))),
        Some(_) => Err(ApiError::InvalidExpiresIn(
            "expires_in must be from 60 to 604800 seconds".into(),
        )),
    }
}

pub(super) async fn part_text(part: Part) -> Result<String, ApiError> {
    let mut bytes = Vec::new();
    let mut stream = part.stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::InvalidMultipart(e.to_string()))?;
        bytes.extend_from_slice(chunk.chunk());
        if bytes.len() > 64 * 1024 {
            return Err(ApiError::InvalidMultipart("a text field is longer than 64 KiB".into()));
        }
    }
    String::from_utf8(bytes).map_err(|_| ApiError::InvalidMultipart("a text field is not UTF-8".into()))
}

async fn upload(state: Arc<AppState>, caller: Caller, form: FormData) -> Result<warp::reply::Response, ApiError> {
    state.jobs()?;
    let (upload, details) = read_upload_form(&state.assets, state.config.max_upload_bytes, caller.tenant, form).await?;
    let (asset, created_new) = state.assets.upload(upload, details).await?;
    let status = if created_new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(reply(status, &render::asset(&state.links, &asset, created_new)))
}

/// Reads and checks `tenant`'s upload `form`: the `file` part streamed into `assets` (at most
/// `max` bytes), the text parts checked. Malformed bodies are `invalid_multipart`, never
/// panics.
pub(crate) async fn read_upload_form(
    assets: &Assets,
    max: u64,
    tenant: String,
    form: FormData,
) -> Result<(Upload, UploadDetails), ApiError> {
    let mut form = form;
    let mut file_path = None;
    let mut content_type = None;
    let mut expected_hash = None;
    let mut tags = Vec::new();
    let mut expires_in = None;
    let mut written = None;
    let mut part_type = None;
    while let Some(part) = form.try_next().await.map_err(multipart_error)? {
        match part.name() {
            "file" => {
                part_type = part.content_type().map(String::from);
                if file_path.is_none() {
                    file_path = part.filename().filter(|f| !f.is_empty()).map(String::from);
                }
                let mut upload = assets.receive().await?;
                let mut stream = part.stream();
                while let Some(chunk) = stream.next().await {
                    let mut chunk = chunk.map_err(multipart_error)?;
                    if upload.size() + chunk.remaining() as u64 > max {
                        return Err(ApiError::PayloadTooLarge(format!(
                            "uploads are limited to {} bytes",
                            max
                        )));
                    }
                    upload.write(chunk.copy_to_bytes(chunk.remaining())).await?;
                }
                written = Some(upload);
            }
            "file_path" => {
                // An empty `file_path` is no name: the file part's filename stands.
                let text = part_text(part).await?;
                if !text.is_empty() {
                    file_path = Some(text);
                }
            }
            "content_type" => content_type = Some(part_text(part).await?),
            "expected_hash" => expected_hash = Some(part_text(part).await?),
            "tags" => tags.push(part_text(part).await?),
            "expires_in" => {
                let text = part_text(part).await?;
                expires_in = Some(
                    text.trim()
                        .parse::<i64>()
                        .map_err(|_| ApiError::InvalidExpiresIn("expires_in must be an integer".into()))?,
                );
            }
            _ => {
                let _ = part_text(part).await;
            }
        }
    }
    let upload = written.ok_or_else(|| ApiError::MissingFile("the upload needs a `file` part".into()))?;
    let file_path = file_path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::MissingFilePath("the upload needs a `file_path` part".into()))?;
    let expires_at = expires_at(expires_in)?;
    let expected_hash = match expected_hash.filter(|h| !h.is_empty()) {
        Some(h) => Some(
            parse_hash(&h)
                .ok_or_else(|| ApiError::InvalidHash("expected_hash must be blake3:<64 hex digits>".into()))?,
        ),
        None => None,
    };
    let content_type = match content_type.filter(|c| !c.is_empty()) {
        Some(c) if !is_media_type(&c) => {
            return Err(ApiError::InvalidContentType(
                "content_type must be a media type such as image/png".into(),
            ))
        }
        given => given.or(part_type.filter(|c| is_media_type(c))),
    };
    let details = UploadDetails {
        tenant,
        file_path,
        content_type,
        tags,
        expires_at,
        expected_hash,
    };
    Ok((upload, details))
}

/// Whether `text` is a media type (`type/subtype`, optionally with parameters) that can be
/// sent back as a `Content-Type` header.
fn is_media_type(text: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    let valid_header = text.len() <= 255 && text.bytes().all(|b| (0x20..0x7f).contains(&b));
    valid_header
        && essence
            .split_once('/')
            .is_some_and(|(kind, sub)| token(kind) && token(sub))
}

pub(super) fn multipart_error(e: warp::Error) -> ApiError {
    let text = e.to_string();
    if text.contains("limit") || text.contains("too large") {
        ApiError::PayloadTooLarge(format!("the upload is larger than allowed: {text}"))
    } else {
        ApiError::InvalidMultipart(format!("the multipart body is malformed: {text}"))
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FromHash {
    hash: String,
    file_path: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    /// Seconds; an integral JSON number, `3600.0` included.
    expires_in: Option<serde_json::Number>,
}

async fn from_hash(
    state: Arc<AppState>,
    caller: Caller,
    body: bytes::Bytes,
) -> Result<warp::reply::Response, ApiError> {
    state.jobs()?;
    let request: FromHash = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidRequest(format!("invalid from-hash request: {e}")))?;
    let hash =
        parse_hash(&request.hash).ok_or_else(|| ApiError::InvalidHash("hash must be blake3:<64 hex digits>".into()))?;
    let expires_in = match request.expires_in {
        None => None,
        Some(n) => Some(
            n.as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                        .map(|f| f as i64)
                })
                .ok_or_else(|| ApiError::InvalidExpiresIn("expires_in must be an integer".into()))?,
        ),
    };
    let expires_at = expires_at(expires_in)?;
    // Only a blob the caller already uses can be adopted: another tenant's is not found.
    let asset = state
        .assets
        .adopt(&caller.tenant, &hash, request.file_path, request.tags, expires_at)
        .await?;
    Ok(reply(StatusCode::CREATED, &render::asset(&state.links, &asset, false)))
}

async fn by_hash(state: Arc<AppState>, caller: Caller, hash: String) -> Result<warp::reply::Response, ApiError> {
    let found = match parse_hash(&hash) {
        Some(hex) => state.assets.has_blob(&caller.tenant, &hex).await?,
        None => false,
    };
    let status = if found { StatusCode::OK } else { StatusCode::NOT_FOUND };
    Ok(warp::reply::with_status(warp::reply(), status).into_response())
}

async fn get(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    let asset = state
        .assets
        .get(&caller.tenant, &id)
        .await?
        .ok_or(ApiError::NotFound("asset".into()))?;
    Ok(reply(StatusCode::OK, &render::asset(&state.links, &asset, false)))
}

async fn delete(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    state.jobs()?;
    if state.assets.delete(&caller.tenant, &id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::NotFound("asset".into()))
    }
}

/// Parses a single `bytes=` range against `size`: `Ok(None)` for no range, `Err` for an
/// unsatisfiable one.
fn parse_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None); // multiple ranges: serve the whole content
    }
    let (start, end) = spec.split_once('-').ok_or(())?;
    let (start, end) = match (start.trim(), end.trim()) {
        ("", suffix) => {
            let n: u64 = suffix.parse().map_err(|_| ())?;
            if n == 0 || size == 0 {
                return Err(());
            }
            (size.saturating_sub(n), size - 1)
        }
        (s, "") => (s.parse().map_err(|_| ())?, size.saturating_sub(1)),
        (s, e) => (
            s.parse().map_err(|_| ())?,
            e.parse::<u64>().map_err(|_| ())?.min(size.saturating_sub(1)),
        ),
    };
    if start >= size || start > end {
        return Err(());
    }
    Ok(Some((start, end)))
}

async fn content(
    state: Arc<AppState>,
    id: String,
    authorization: Option<String>,
    query: std::collections::HashMap<String, String>,
    range: Option<String>,
) -> Result<warp::reply::Response, ApiError> {
    let signed = match (
        query.get("expires").and_then(|e| e.parse::<i64>().ok()),
        query.get("sig"),
    ) {
        (Some(expires), Some(sig)) => state.links.verify(&id, expires, sig),
        _ => false,
    };
    let asset = if signed {
        state.assets.get_any(&id).await?
    } else {
        let caller = auth::authenticate(&state, authorization.as_deref()).await?;
        state.assets.get(&caller.tenant, &id).await?
    };
    let asset = asset.ok_or(ApiError::NotFound("asset".into()))?;
    let size = asset.size_bytes.max(0) as u64;
    let range = parse_range(range.as_deref(), size).map_err(|_| ApiError::RangeNotSatisfiable { size })?;
    let (start, len, status) = match range {
        Some((start, end)) => (start, end - start + 1, StatusCode::PARTIAL_CONTENT),
        None => (0, size, StatusCode::OK),
    };
    let body = state.assets.read(&asset, start..start + len).await?;
    let mut response = warp::http::Response::new(warp::hyper::Body::wrap_stream(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-length", HeaderValue::from(len));
    headers.insert("accept-ranges", HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", asset.blob)) {
        headers.insert("etag", v);
    }
    content_safety_headers(headers, &asset.content_type, &asset.file_path);
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1)) {
            headers.insert("content-range", v);
        }
    }
    Ok(response)
}

/// Media types a browser may show inline on the API's origin: images, audio and video it
/// renders without running script, and plain text. Anything else (HTML, SVG, XML,
/// JavaScript, PDF, unknown types) is served as an attachment.
const INLINE_TYPES: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/avif",
    "image/bmp",
    "audio/wav",
    "audio/x-wav",
    "audio/wave",
    "audio/mpeg",
    "audio/ogg",
    "audio/flac",
    "audio/aac",
    "audio/mp4",
    "audio/webm",
    "video/mp4",
    "video/webm",
    "video/ogg",
    "text/plain",
];

/// Headers that keep content uploaded by tenants or written by plugins from acting as a
/// page of the API's origin: its declared type with `nosniff`, a CSP `sandbox` (no
/// script, no same origin, even when opened directly), and `attachment` for every type a
/// browser could run. The file name is reduced to safe characters.
pub(super) fn content_safety_headers(headers: &mut warp::http::HeaderMap, content_type: &str, file_path: &str) {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let inline = INLINE_TYPES.contains(&essence.as_str());
    let served_type = HeaderValue::from_str(content_type)
        .ok()
        .filter(|_| !essence.is_empty())
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    headers.insert("content-type", served_type);
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("sandbox; default-src 'none'; img-src 'self'; media-src 'self'"),
    );
    let name: String = file_path
        .rsplit('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ' '))
        .take(200)
        .collect();
    let name = if name.trim_matches('.').is_empty() {
        "file".to_string()
    } else {
        name
    };
    let disposition = if inline { "inline" } else { "attachment" };
    if let Ok(v) = HeaderValue::from_str(&format!("{disposition}; filename=\"{name}\"")) {
        headers.insert("content-disposition", v);
    }
}

#[cfg(test)]
mod tests {
    use super::{content_safety_headers, parse_range};

    #[test]
    fn unsafe_types_are_attachments_and_everything_is_sandboxed() {
        for (content_type, disposition) in [
            ("image/png", "inline"),
            ("text/plain; charset=utf-8", "inline"),
            ("text/html", "attachment"),
            ("image/svg+xml", "attachment"),
            ("application/xml", "attachment"),
            ("text/javascript", "attachment"),
            ("application/x-unknown", "attachment"),
            ("", "attachment"),
        ] {
            let mut headers = warp::http::HeaderMap::new();
            content_safety_headers(&mut headers, content_type, "a/b\"x.png");
            let got = headers["content-disposition"].to_str().unwrap();
            assert!(got.starts_with(disposition), "{content_type}: {got}");
            assert!(got.ends_with("filename=\"bx.png\""), "{got}");
            assert_eq!(headers["x-content-type-options"], "nosniff");
            assert!(headers["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("sandbox"));
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=-4"), 10), Ok(Some((6, 9))));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some((8, 9))));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=5-2"), 10), Err(()));
    }
}
