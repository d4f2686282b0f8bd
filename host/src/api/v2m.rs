//! `POST {mount_prefix}/proxy/audio/v2m/generate`: music from a video, streamed as NDJSON.
//!
//! The request is `multipart/form-data` with a `0.video` file part (streamed to a temporary
//! file under `<data>/v2m-tmp`, size-checked while it arrives, never buffered whole) or a
//! `video` reference (an asset id of the caller's, or an `http://` or `https://` URL on a host
//! the operator allowed), plus optional `prompt`, `copies` and `seed` parts. A bearer token is always
//! required. Failures before the stream starts answer `{"detail": {"code", "message"}}`
//! ([`DetailError`]); after that they are `{"type":"error"}` events.
//!
//! The 200 body is one JSON event per line: `duration`, `titles`, one `title` per stream,
//! then the streams' `audio_chunk`s interleaved (each stream's chunks concatenate to one
//! 16-bit PCM WAV file), then `complete`. Streams render on blocking threads, at most one
//! per CPU across all requests; a client that disconnects stops the work, and the temporary
//! video is removed by a guard whatever happens.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use serde_json::{json, Value as Json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::TlsConnector;
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue, StatusCode};
use warp::{Filter, Reply};

use super::auth::{self, AuthMode, Caller};
use super::{ApiError, AppState};
use crate::v2m::{self, Engine, Renderer, V2mConfig, V2mError, VideoInfo};

/// Room for the multipart framing and the text parts on top of the video's bytes.
const MULTIPART_SLACK: u64 = 256 * 1024;
/// Longest text part.
const MAX_TEXT_PART: usize = 64 * 1024;
/// Body bytes read and discarded before an early error is answered, so that a client still
/// sending a small request reads the error instead of a reset connection.
const EARLY_DRAIN: u64 = 1024 * 1024;
/// How long fetching a video URL may wait for a connection or for response headers.
const URL_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Operator settings of the endpoint (from `weft serve` flags).
#[derive(Debug, Clone)]
pub struct V2mSettings {
    /// General MIDI SoundFont used for synthesis.
    pub soundfont: PathBuf,
    /// Largest accepted video, in bytes (upload or URL download).
    pub max_upload_bytes: u64,
    /// Longest accepted video, in seconds.
    pub max_duration_secs: u64,
    /// Most streams (`copies`) one request may ask for.
    pub max_copies: u32,
    /// Hosts that `video` URLs may name (exact, case-insensitive). Empty: no URLs.
    pub allow_url_hosts: Vec<String>,
    /// Accept URLs that resolve to loopback, private or link-local addresses.
    pub allow_private_urls: bool,
    /// PEM certificates trusted for `https://` video URLs on top of the built-in roots.
    pub url_ca_file: Option<PathBuf>,
}

impl Default for V2mSettings {
    fn default() -> Self {
        Self {
            soundfont: PathBuf::from(v2m::DEFAULT_SOUNDFONT),
            max_upload_bytes: 300_000_000,
            max_duration_secs: 360,
            max_copies: 4,
            allow_url_hosts: Vec::new(),
            allow_private_urls: false,
            url_ca_file: None,
        }
    }
}

/// The endpoint's engine, settings and temporary directory, made once at start-up.
pub struct V2mService {
    engine: Engine,
    settings: V2mSettings,
    tmp_dir: PathBuf,
    renders: Arc<Semaphore>,
    tls: TlsConnector,
}

impl V2mService {
    /// Loads the SoundFont and prepares `<data_dir>/v2m-tmp` (emptied of leftovers).
    pub fn new(settings: &V2mSettings, data_dir: &Path) -> Result<Self, V2mError> {
        let tmp_dir = data_dir.join("v2m-tmp");
        std::fs::create_dir_all(&tmp_dir)
            .map_err(|e| V2mError::GenerationFailed(format!("creating {}: {e}", tmp_dir.display())))?;
        if let Ok(entries) = std::fs::read_dir(&tmp_dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let engine = Engine::new(V2mConfig {
            soundfont: settings.soundfont.clone(),
            max_duration: Duration::from_secs(settings.max_duration_secs),
            max_copies: settings.max_copies,
            max_upload_bytes: settings.max_upload_bytes,
            ..V2mConfig::default()
        })?;
        v2m::set_shared(engine.clone(), tmp_dir.clone());
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            engine,
            settings: settings.clone(),
            tmp_dir,
            renders: Arc::new(Semaphore::new(cpus)),
            tls: tls_connector(settings.url_ca_file.as_deref())?,
        })
    }

    /// The engine (shared with the `VideoToMusic` node).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// TLS for `https://` video URLs: Mozilla's root certificates (built in, so no OS store is
/// needed) plus those in `ca_file`.
fn tls_connector(ca_file: Option<&Path>) -> Result<TlsConnector, V2mError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let bad = |e: String| V2mError::GenerationFailed(format!("the URL CA file {}: {e}", path.display()));
        let mut added = 0;
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
            roots
                .add(cert.map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("no certificates in it".into()));
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| V2mError::GenerationFailed(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// An error answered before the stream starts, as `{"detail": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetailError {
    /// 400 `missing_video`: no `0.video` file and no `video` reference, or the referenced
    /// asset is not the caller's.
    MissingVideo(String),
    /// 415 `unsupported_video`: the file is not a video ffprobe can read, or has no video
    /// stream, or the URL did not answer with one.
    UnsupportedVideo(String),
    /// 422 `video_too_long`: longer than the duration limit.
    VideoTooLong(String),
    /// 413 `upload_too_large`: more bytes than the size limit.
    UploadTooLarge(String),
    /// 401 `unauthorized`: no bearer token, or one the server does not accept.
    Unauthorized,
    /// 500 `generation_failed`: the server could not generate.
    GenerationFailed(String),
    /// 400 `invalid_request`: a malformed body, a bad `copies` or `seed`, or a URL the
    /// server refuses to fetch.
    InvalidRequest(String),
}

impl DetailError {
    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            DetailError::MissingVideo(_) | DetailError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            DetailError::UnsupportedVideo(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            DetailError::VideoTooLong(_) => StatusCode::UNPROCESSABLE_ENTITY,
            DetailError::UploadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            DetailError::Unauthorized => StatusCode::UNAUTHORIZED,
            DetailError::GenerationFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            DetailError::MissingVideo(_) => "missing_video",
            DetailError::UnsupportedVideo(_) => "unsupported_video",
            DetailError::VideoTooLong(_) => "video_too_long",
            DetailError::UploadTooLarge(_) => "upload_too_large",
            DetailError::Unauthorized => "unauthorized",
            DetailError::GenerationFailed(_) => "generation_failed",
            DetailError::InvalidRequest(_) => "invalid_request",
        }
    }

    /// Human-readable message.
    pub fn message(&self) -> String {
        match self {
            DetailError::Unauthorized => "a valid `Authorization: Bearer <token>` header is required".into(),
            DetailError::MissingVideo(m)
            | DetailError::UnsupportedVideo(m)
            | DetailError::VideoTooLong(m)
            | DetailError::UploadTooLarge(m)
            | DetailError::GenerationFailed(m)
            | DetailError::InvalidRequest(m) => m.clone(),
        }
    }
}

impl From<V2mError> for DetailError {
    fn from(e: V2mError) -> Self {
        match e {
            V2mError::MissingVideo => DetailError::UnsupportedVideo("the file has no video stream".into()),
            V2mError::UnreadableVideo(m) => {
                DetailError::UnsupportedVideo(format!("the file is not a readable video: {m}"))
            }
            e @ V2mError::VideoTooLong { .. } => DetailError::VideoTooLong(e.to_string()),
            e @ V2mError::UploadTooLarge { .. } => DetailError::UploadTooLarge(e.to_string()),
            e @ V2mError::TooManyCopies { .. } => DetailError::InvalidRequest(e.to_string()),
            e @ (V2mError::SoundFont(_) | V2mError::GenerationFailed(_)) => {
                tracing::error!(error = %e, "video-to-music failed");
                DetailError::GenerationFailed("music generation failed".into())
            }
        }
    }
}

impl Reply for DetailError {
    fn into_response(self) -> warp::reply::Response {
        let body = json!({ "detail": { "code": self.code(), "message": self.message() } });
        let mut response = warp::reply::with_status(warp::reply::json(&body), self.status()).into_response();
        if self == DetailError::Unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The route, at the server's root (under the mount prefix, not under `/api/v2`).
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let mut base = warp::any().boxed();
    for segment in state.config.mount_prefix.split('/').filter(|s| !s.is_empty()) {
        base = base.and(warp::path(segment.to_string())).boxed();
    }
    base.and(warp::path!("proxy" / "audio" / "v2m" / "generate"))
        .and(warp::post())
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::header::optional::<String>("content-type"))
        .and(warp::header::optional::<String>("content-length"))
        .and(warp::body::stream())
        .and_then(move |authorization, content_type, content_length, body| {
            let state = state.clone();
            async move {
                let request = Request {
                    authorization,
                    content_type,
                    content_length,
                };
                let result = generate(state, request, body).await;
                Ok::<_, warp::Rejection>(result.unwrap_or_else(Reply::into_response))
            }
        })
        .boxed()
}

/// The headers the handler reads.
struct Request {
    authorization: Option<String>,
    content_type: Option<String>,
    content_length: Option<String>,
}

/// The caller: a bearer token is required even under `--auth none`, where any is accepted.
async fn authorize(state: &AppState, header: Option<&str>) -> Result<Caller, DetailError> {
    if auth::bearer(header).is_none() {
        return Err(DetailError::Unauthorized);
    }
    if state.config.auth == AuthMode::None {
        return Ok(Caller {
            tenant: auth::DEFAULT_TENANT.into(),
            origin: None,
        });
    }
    auth::authenticate(state, header).await.map_err(|e| match e {
        ApiError::Unauthorized | ApiError::Forbidden(_) => DetailError::Unauthorized,
        _ => DetailError::GenerationFailed("credentials could not be checked".into()),
    })
}

/// A file under the temporary directory, removed when dropped (unless it is borrowed).
struct TempVideo {
    path: PathBuf,
    owned: bool,
}

impl TempVideo {
    fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(format!("{}.video", uuid::Uuid::new_v4().simple())),
            owned: true,
        }
    }
}

impl Drop for TempVideo {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The parts of the form, once read.
#[derive(Default)]
struct Form {
    upload: Option<(TempVideo, blake3::Hash)>,
    reference: Option<String>,
    prompt: Option<String>,
    copies: Option<String>,
    seed: Option<String>,
}

fn multipart_error(e: multer::Error, max: u64) -> DetailError {
    match e {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => too_large(max),
        e => DetailError::InvalidRequest(format!("the multipart body is malformed: {e}")),
    }
}

fn too_large(max: u64) -> DetailError {
    DetailError::UploadTooLarge(format!("the video is larger than the limit of {max} bytes"))
}

async fn text_part(mut field: multer::Field<'_>, max: u64) -> Result<String, DetailError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|e| multipart_error(e, max))? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_TEXT_PART {
            return Err(DetailError::InvalidRequest("a text part is longer than 64 KiB".into()));
        }
    }
    String::from_utf8(bytes).map_err(|_| DetailError::InvalidRequest("a text part is not UTF-8".into()))
}

/// Writes a byte stream to a new temporary file, hashing it and enforcing `max` as it goes.
/// With `drain`, past `max` it stops writing but keeps reading (the caller bounds the whole
/// body), so that a client that is still sending gets the 413 rather than a broken
/// connection; without, it stops at once.
async fn stream_to_temp<S, E>(
    dir: &Path,
    mut chunks: S,
    max: u64,
    drain: bool,
) -> Result<(TempVideo, blake3::Hash, u64), DetailError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<DetailError>,
{
    let temp = TempVideo::new(dir);
    let failed = |e: std::io::Error| {
        tracing::error!(error = %e, "writing a temporary video");
        DetailError::GenerationFailed("the video could not be stored".into())
    };
    let mut file = tokio::fs::File::create(&temp.path).await.map_err(failed)?;
    let mut hasher = blake3::Hasher::new();
    let mut size = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(Into::into)?;
        size += chunk.len() as u64;
        if size > max {
            if drain {
                continue;
            }
            return Err(too_large(max));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(failed)?;
    }
    if size > max {
        return Err(too_large(max));
    }
    file.flush().await.map_err(failed)?;
    Ok((temp, hasher.finalize(), size))
}

async fn read_form<S>(svc: &V2mService, content_type: Option<&str>, body: S) -> Result<Form, DetailError>
where
    S: Stream<Item = Result<Bytes, warp::Error>> + Send + 'static,
{
    let max = svc.settings.max_upload_bytes;
    let boundary = content_type
        .and_then(|ct| multer::parse_boundary(ct).ok())
        .ok_or_else(|| DetailError::InvalidRequest("the body must be multipart/form-data".into()))?;
    let constraints = multer::Constraints::new()
        .size_limit(multer::SizeLimit::new().whole_stream(max.saturating_add(MULTIPART_SLACK)));
    let mut multipart = multer::Multipart::with_constraints(body, boundary, constraints);
    let mut form = Form::default();
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, max))? {
        match field.name() {
            Some("0.video") => {
                if form.upload.is_some() {
                    return Err(DetailError::InvalidRequest("more than one `0.video` part".into()));
                }
                let chunks = field.map(|r| r.map_err(|e| multipart_error(e, max)));
                let (temp, hash, size) = stream_to_temp(&svc.tmp_dir, Box::pin(chunks), max, true).await?;
                // Browsers send an empty file part when no file was chosen.
                if size > 0 {
                    form.upload = Some((temp, hash));
                }
            }
            Some("video") => form.reference = Some(text_part(field, max).await?),
            Some("prompt") => form.prompt = Some(text_part(field, max).await?),
            Some("copies") => form.copies = Some(text_part(field, max).await?),
            Some("seed") => form.seed = Some(text_part(field, max).await?),
            _ => {} // unknown parts are skipped by the next `next_field`
        }
    }
    Ok(form)
}

async fn generate<S, B>(state: Arc<AppState>, request: Request, body: S) -> Result<warp::reply::Response, DetailError>
where
    S: Stream<Item = Result<B, warp::Error>> + Send + 'static,
    B: Buf + Send,
{
    let early = match authorize(&state, request.authorization.as_deref()).await {
        Ok(caller) => state.v2m.clone().map(|svc| (caller, svc)).ok_or_else(|| {
            DetailError::GenerationFailed(
                "video-to-music is not available on this server (see its start-up log)".into(),
            )
        }),
        Err(e) => Err(e),
    };
    let (caller, svc) = match early {
        Ok(ready) => ready,
        Err(e) => {
            let mut body = Box::pin(body);
            let mut read = 0u64;
            while let Some(Ok(chunk)) = body.next().await {
                read += chunk.remaining() as u64;
                if read > EARLY_DRAIN {
                    break;
                }
            }
            return Err(e);
        }
    };
    let max = svc.settings.max_upload_bytes;
    let announced = request
        .content_length
        .as_deref()
        .and_then(|l| l.trim().parse::<u64>().ok());
    if announced.is_some_and(|len| len > max.saturating_add(MULTIPART_SLACK)) {
        return Err(too_large(max));
    }
    let body = body.map(|r| r.map(|mut b| b.copy_to_bytes(b.remaining())));
    let form = read_form(&svc, request.content_type.as_deref(), body).await?;

    let copies = match form.copies.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
        None => 1,
        Some(text) => text.parse::<u32>().map_err(|_| {
            DetailError::InvalidRequest(format!(
                "`copies` must be an integer from 1 to {}",
                svc.settings.max_copies
            ))
        })?,
    };
    svc.engine.check_copies(copies)?;
    let seed = match form.seed.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| DetailError::InvalidRequest("`seed` must be a non-negative integer".into()))?,
        ),
    };
    let prompt = form.prompt.map(|p| p.trim().to_string()).filter(|p| !p.is_empty());
    let reference = form.reference.map(|r| r.trim().to_string()).filter(|r| !r.is_empty());

    let (video, content_key) = match (form.upload, reference) {
        (Some(_), Some(_)) => {
            return Err(DetailError::InvalidRequest(
                "give either a `0.video` file or a `video` reference, not both".into(),
            ))
        }
        (Some((temp, hash)), None) => (temp, hash.to_hex().to_string()),
        (None, Some(reference)) => resolve_reference(&state, &svc, &caller, &reference).await?,
        (None, None) => {
            return Err(DetailError::MissingVideo(
                "the request has no `0.video` file part and no `video` reference".into(),
            ))
        }
    };
    let info = svc.engine.probe(&video.path).await?;
    let seed = seed.unwrap_or_else(|| default_seed(&content_key, prompt.as_deref()));

    let (tx, rx) = mpsc::channel::<Bytes>(32);
    tokio::spawn(produce(svc, video, info, prompt, copies, seed, tx));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    let mut response = warp::reply::Response::new(warp::hyper::Body::wrap_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Same video and prompt, same music: the seed defaults to a hash of both.
fn default_seed(content_key: &str, prompt: Option<&str>) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(content_key.as_bytes());
    hasher.update(&[0]);
    hasher.update(prompt.unwrap_or("").as_bytes());
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// An asset id of the caller's, or an allowed `http(s)://` URL.
async fn resolve_reference(
    state: &AppState,
    svc: &V2mService,
    caller: &Caller,
    reference: &str,
) -> Result<(TempVideo, String), DetailError> {
    if reference.contains("://") {
        return fetch_url(svc, reference).await;
    }
    let asset = state.assets.get(&caller.tenant, reference).await.map_err(|e| {
        tracing::error!(error = %e, "reading an asset");
        DetailError::GenerationFailed("the video reference could not be looked up".into())
    })?;
    let asset = asset.ok_or_else(|| {
        DetailError::MissingVideo(format!(
            "`video` names no asset of yours: {reference:?} (give an asset id or a URL)"
        ))
    })?;
    let blob = state.assets.blob_path(&asset);
    // A hard link keeps the bytes readable even if the asset is deleted meanwhile.
    let temp = TempVideo::new(&svc.tmp_dir);
    let temp = match std::fs::hard_link(&blob, &temp.path) {
        Ok(()) => temp,
        Err(_) => {
            drop(temp);
            TempVideo {
                path: blob,
                owned: false,
            }
        }
    };
    Ok((temp, asset.blob))
}

/// Whether `ip` is an address a server-side fetch must not reach by default.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1])) // shared address space
                || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
                || (o[0] == 198 && (18..20).contains(&o[1])) // benchmarking
                || o[0] >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64
                || (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0 && s[4] == 0 && s[5] == 0)
            // IPv4-compatible
        }
    }
}

/// Downloads an allowed `http://` or `https://` URL into a temporary file. The host must be
/// on the operator's list; its name is resolved here and every address checked, the
/// connection goes to a checked address (so a second lookup cannot change it), TLS verifies
/// the certificate against the URL's host name, and redirects are not followed.
async fn fetch_url(svc: &V2mService, text: &str) -> Result<(TempVideo, String), DetailError> {
    let refuse = |m: String| DetailError::InvalidRequest(m);
    let url = url::Url::parse(text).map_err(|_| refuse("`video` is not a valid URL".into()))?;
    let host = url
        .host_str()
        .ok_or_else(|| refuse("the video URL has no host".into()))?
        .trim_matches(|c| c == '[' || c == ']')
        .to_ascii_lowercase();
    let allowed = svc
        .settings
        .allow_url_hosts
        .iter()
        .any(|h| h.trim_matches(|c| c == '[' || c == ']').eq_ignore_ascii_case(&host));
    if !allowed {
        return Err(refuse(format!("this server does not fetch videos from host {host:?}")));
    }
    let tls = match url.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(refuse(format!(
                "video URLs must be http:// or https://, not {other}://"
            )))
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("video URLs may not carry credentials".into()));
    }
    let port = url.port_or_known_default().unwrap_or(if tls { 443 } else { 80 });
    let addresses: Vec<SocketAddr> = match url.host() {
        Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
        Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
        Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port))
            .await
            .map_err(|e| DetailError::UnsupportedVideo(format!("cannot resolve {name}: {e}")))?
            .collect(),
        None => Vec::new(),
    };
    if addresses.is_empty() {
        return Err(DetailError::UnsupportedVideo(format!("{host} has no address")));
    }
    if !svc.settings.allow_private_urls {
        if let Some(bad) = addresses.iter().find(|a| is_internal(a.ip())) {
            return Err(refuse(format!(
                "{host} resolves to a non-public address ({}); refused",
                bad.ip()
            )));
        }
    }
    let unreadable = |m: String| DetailError::UnsupportedVideo(format!("fetching the video URL failed: {m}"));
    let authority = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let request = warp::hyper::Request::get(path)
        .header(header::HOST, authority)
        .header(header::USER_AGENT, "weft-v2m")
        .body(warp::hyper::Body::empty())
        .map_err(|e| refuse(format!("bad video URL: {e}")))?;
    let stream = tokio::time::timeout(URL_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&addresses[..]))
        .await
        .map_err(|_| unreadable("connection timed out".into()))?
        .map_err(|e| unreadable(e.to_string()))?;
    let response = if tls {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|_| refuse(format!("{host:?} is not a name TLS can verify")))?;
        let stream = tokio::time::timeout(URL_CONNECT_TIMEOUT, svc.tls.connect(name, stream))
            .await
            .map_err(|_| unreadable("the TLS handshake timed out".into()))?
            .map_err(|e| unreadable(format!("TLS: {e}")))?;
        get_over(stream, request).await
    } else {
        get_over(stream, request).await
    }
    .map_err(unreadable)?;
    if !response.status().is_success() {
        return Err(unreadable(format!("the server answered HTTP {}", response.status())));
    }
    let max = svc.settings.max_upload_bytes;
    let announced = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|len| len > max) {
        return Err(too_large(max));
    }
    let chunks = response
        .into_body()
        .map(|r| r.map_err(|e| DetailError::UnsupportedVideo(format!("fetching the video URL failed: {e}"))));
    let (temp, hash, _) = stream_to_temp(&svc.tmp_dir, chunks, max, false).await?;
    Ok((temp, hash.to_hex().to_string()))
}

/// Sends `request` as HTTP/1.1 over `stream` and waits for the response headers.
async fn get_over<S>(
    stream: S,
    request: warp::hyper::Request<warp::hyper::Body>,
) -> Result<warp::hyper::Response<warp::hyper::Body>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = warp::hyper::client::conn::handshake(stream)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    tokio::time::timeout(URL_CONNECT_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| "no response".to_string())?
        .map_err(|e| e.to_string())
}

fn line(event: &Json) -> Bytes {
    let mut text = event.to_string();
    text.push('\n');
    Bytes::from(text)
}

fn error_event(code: &str, message: &str) -> Bytes {
    line(&json!({ "type": "error", "code": code, "message": message }))
}

/// Produces the event stream; returns early (dropping the video guard, killing ffmpeg)
/// as soon as the client has gone.
async fn produce(
    svc: Arc<V2mService>,
    video: TempVideo,
    info: VideoInfo,
    prompt: Option<String>,
    copies: u32,
    seed: u64,
    tx: mpsc::Sender<Bytes>,
) {
    let duration = json!({ "type": "duration", "duration_sec": info.duration_s });
    if tx.send(line(&duration)).await.is_err() {
        return;
    }
    let analysis = tokio::select! {
        analysis = svc.engine.analyze_probed(&video.path, info) => analysis,
        _ = tx.closed() => return,
    };
    drop(video);
    let analysis = match analysis {
        Ok(a) => a,
        Err(e) => {
            let e = DetailError::from(e);
            let _ = tx.send(error_event(e.code(), &e.message())).await;
            return;
        }
    };
    let prompts: Vec<&str> = prompt.as_deref().into_iter().collect();
    let plans = v2m::plan(&analysis, &prompts, copies, seed);
    let titles: Vec<&str> = plans.iter().map(|p| p.title.as_str()).collect();
    if tx
        .send(line(&json!({ "type": "titles", "titles": titles })))
        .await
        .is_err()
    {
        return;
    }
    for p in &plans {
        let title = json!({
            "type": "title",
            "copy_index": p.copy_index,
            "prompt_index": p.prompt_index,
            "stream_index": p.stream_index,
            "title": p.title,
            "display_tags": p.display_tags,
            "summary": p.summary,
        });
        if tx.send(line(&title)).await.is_err() {
            return;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut renders = Vec::new();
    for p in &plans {
        let renderer = match svc.engine.render(p) {
            Ok(r) => r,
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                let e = DetailError::from(e);
                let _ = tx.send(error_event(e.code(), &e.message())).await;
                return;
            }
        };
        let (tx, stop, renders_limit, index) = (tx.clone(), stop.clone(), svc.renders.clone(), p.stream_index);
        renders.push(tokio::spawn(async move {
            let permit = tokio::select! {
                permit = renders_limit.acquire_owned() => permit.ok(),
                _ = tx.closed() => None,
            };
            let Some(permit) = permit else { return Ok(false) };
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                render_stream(renderer, index, &tx, &stop)
            })
            .await
        }));
    }
    let mut failed = false;
    for render in renders {
        match render.await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return, // the client went away
            Ok(Err(e)) | Err(e) => {
                tracing::error!(error = %e, "a video-to-music render failed");
                failed = true;
                stop.store(true, Ordering::SeqCst);
            }
        }
    }
    let last = if failed {
        error_event("generation_failed", "rendering a stream failed")
    } else {
        line(&json!({ "type": "complete" }))
    };
    let _ = tx.send(last).await;
}

/// Sends one stream's chunks; `false` when it stopped early (client gone, or told to).
fn render_stream(renderer: Renderer, index: u32, tx: &mpsc::Sender<Bytes>, stop: &AtomicBool) -> bool {
    for chunk in renderer {
        if tx.is_closed() || stop.load(Ordering::SeqCst) {
            return false;
        }
        let data = base64::engine::general_purpose::STANDARD.encode(&chunk);
        let text = format!("{{\"type\":\"audio_chunk\",\"stream_index\":{index},\"data\":\"{data}\"}}\n");
        if tx.blocking_send(Bytes::from(text)).is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "151.101.1.1", "2606:4700::1111"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn errors_render_detail() {
        let e = DetailError::VideoTooLong("long".into());
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.code(), "video_too_long");
        let e: DetailError = V2mError::UnreadableVideo("x".into()).into();
        assert_eq!(e.code(), "unsupported_video");
        assert_eq!(DetailError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn default_seed_depends_on_video_and_prompt() {
        assert_eq!(default_seed("a", Some("p")), default_seed("a", Some("p")));
        assert_ne!(default_seed("a", Some("p")), default_seed("b", Some("p")));
        assert_ne!(default_seed("a", Some("p")), default_seed("a", None));
    }
}
