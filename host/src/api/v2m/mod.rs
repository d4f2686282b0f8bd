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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, Semaphore};
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue};
use warp::{Filter, Reply};
use weft_v2m::{self as v2m, Engine, TempVideo, V2mConfig, V2mError};

use super::auth::{self, AuthMode, Caller};
use super::{ApiError, AppState};

mod detail;
mod events;
mod fetch;
pub(crate) mod form;

pub use detail::DetailError;

use fetch::UrlFetcher;
use form::{read_form, too_large, MULTIPART_SLACK};

/// Body bytes read and discarded before an early error is answered, so that a client still
/// sending a small request reads the error instead of a reset connection.
const EARLY_DRAIN: u64 = 1024 * 1024;

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
    /// Longest a URL download may take in all.
    pub url_timeout: Duration,
}

impl Default for V2mSettings {
    fn default() -> Self {
        Self {
            soundfont: PathBuf::from(v2m::DEFAULT_SOUNDFONT),
            max_upload_bytes: v2m::DEFAULT_MAX_UPLOAD_BYTES,
            max_duration_secs: v2m::DEFAULT_MAX_DURATION_SECS,
            max_copies: v2m::DEFAULT_MAX_COPIES,
            allow_url_hosts: Vec::new(),
            allow_private_urls: false,
            url_ca_file: None,
            url_timeout: Duration::from_secs(300),
        }
    }
}

impl V2mSettings {
    /// The engine's configuration for these settings, with its videos in `temp_dir`.
    pub fn engine_config(&self, temp_dir: PathBuf) -> V2mConfig {
        V2mConfig {
            soundfont: self.soundfont.clone(),
            max_duration: Duration::from_secs(self.max_duration_secs),
            max_copies: self.max_copies,
            max_upload_bytes: self.max_upload_bytes,
            temp_dir,
            ..V2mConfig::default()
        }
    }
}

/// The endpoint's engine (shared with the `VideoToMusic` node), settings and URL client,
/// made once at start-up.
pub struct V2mService {
    engine: Arc<Engine>,
    settings: V2mSettings,
    renders: Arc<Semaphore>,
    urls: UrlFetcher,
}

impl V2mService {
    /// The endpoint over `engine`; an error when the URL CA file cannot be used.
    pub fn new(settings: &V2mSettings, engine: Arc<Engine>) -> Result<Self, V2mError> {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            engine,
            settings: settings.clone(),
            renders: Arc::new(Semaphore::new(cpus)),
            urls: UrlFetcher::new(settings)?,
        })
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
        });
    }
    auth::authenticate(state, header).await.map_err(|e| match e {
        ApiError::Unauthorized | ApiError::Forbidden(_) => DetailError::Unauthorized,
        _ => DetailError::GenerationFailed("credentials could not be checked".into()),
    })
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
    let form = read_form(svc.engine.temp_video(), max, request.content_type.as_deref(), body).await?;

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
    let info = svc.engine.probe(video.path()).await?;
    let seed = seed.unwrap_or_else(|| default_seed(&content_key, prompt.as_deref()));

    let (tx, rx) = mpsc::channel::<Bytes>(32);
    tokio::spawn(events::produce(svc, video, info, prompt, copies, seed, tx));
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
        return svc
            .urls
            .fetch(reference, svc.engine.temp_video(), svc.settings.max_upload_bytes)
            .await;
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
    let temp = svc.engine.temp_video();
    let Some(blob) = state.assets.blob_file(&asset) else {
        // In object storage: ffmpeg needs a file, so the blob is copied (within the upload
        // bound), and the copy removed with `temp`.
        state
            .assets
            .download(&asset, temp.path(), svc.settings.max_upload_bytes)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "copying a video blob");
                DetailError::GenerationFailed("the video could not be read".into())
            })?;
        return Ok((temp, asset.blob));
    };
    // A hard link keeps the bytes readable even if the asset is deleted meanwhile.
    let temp = match std::fs::hard_link(&blob, temp.path()) {
        Ok(()) => temp,
        Err(_) => {
            drop(temp);
            TempVideo::borrowed(blob)
        }
    };
    Ok((temp, asset.blob))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_seed_depends_on_video_and_prompt() {
        assert_eq!(default_seed("a", Some("p")), default_seed("a", Some("p")));
        assert_ne!(default_seed("a", Some("p")), default_seed("b", Some("p")));
        assert_ne!(default_seed("a", Some("p")), default_seed("a", None));
    }
}
