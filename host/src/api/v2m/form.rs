//! Reading the request's `multipart/form-data` body: the video file part streamed to a
//! temporary file (hashed and size-checked as it arrives), and the short text parts.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use weft_v2m::TempVideo;

use super::DetailError;

/// Room for the multipart framing and the text parts on top of the video's bytes.
pub(super) const MULTIPART_SLACK: u64 = 256 * 1024;
/// Longest text part.
const MAX_TEXT_PART: usize = 64 * 1024;

/// The parts of the form, once read.
#[derive(Default)]
pub(crate) struct Form {
    /// The `0.video` file, with the blake3 of its bytes.
    pub(crate) upload: Option<(TempVideo, blake3::Hash)>,
    /// The `video` reference: an asset id or a URL.
    pub(super) reference: Option<String>,
    /// The `prompt` part.
    pub(super) prompt: Option<String>,
    /// The `copies` part, unparsed.
    pub(super) copies: Option<String>,
    /// The `seed` part, unparsed.
    pub(super) seed: Option<String>,
}

fn multipart_error(e: multer::Error, max: u64) -> DetailError {
    if is_size_exceeded(&e) {
        return too_large(max);
    }
    DetailError::InvalidRequest(format!("the multipart body is malformed: {e}"))
}

/// Whether `e` is a size limit, also when multer wraps it as a failed read (it does with
/// every error of the body stream, and a chunked body has no length to check first).
fn is_size_exceeded(e: &multer::Error) -> bool {
    match e {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => true,
        multer::Error::StreamReadFailed(inner) => {
            inner.is::<BodyTooLarge>() || inner.downcast_ref::<multer::Error>().is_some_and(is_size_exceeded)
        }
        _ => false,
    }
}

/// The body passed `limit` bytes.
#[derive(Debug, thiserror::Error)]
#[error("the body is larger than {0} bytes")]
struct BodyTooLarge(u64);

/// `body`, ending with [`BodyTooLarge`] once it passes `limit` bytes. Before that error it
/// reads and discards up to `drain` more bytes, so that a client still sending its upload
/// gets the 413 rather than a connection closed under it (many clients do not read an answer
/// before their request is sent).
fn bounded<S>(body: S, limit: u64, drain: u64) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, warp::Error>> + Send + 'static,
{
    let state = (Box::pin(body), 0u64, false);
    futures::stream::unfold(state, move |(mut body, mut total, ended)| async move {
        if ended {
            return None;
        }
        match body.next().await? {
            Err(e) => Some((Err(BoxError::from(e)), (body, total, true))),
            Ok(chunk) => {
                total = total.saturating_add(chunk.len() as u64);
                if total <= limit {
                    return Some((Ok(chunk), (body, total, false)));
                }
                let mut drained = 0u64;
                while drained < drain {
                    match body.next().await {
                        Some(Ok(chunk)) => drained = drained.saturating_add(chunk.len() as u64),
                        _ => break,
                    }
                }
                Some((Err(BoxError::from(BodyTooLarge(limit))), (body, total, true)))
            }
        }
    })
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// 413 for a video over `max` bytes.
pub(super) fn too_large(max: u64) -> DetailError {
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

/// Writes a byte stream to `temp`, hashing it and enforcing `max` as it goes.
/// With `drain`, past `max` it stops writing but keeps reading (the caller bounds the whole
/// body), so that a client that is still sending gets the 413 rather than a broken
/// connection; without, it stops at once.
pub(super) async fn stream_to_temp<S, E>(
    temp: TempVideo,
    mut chunks: S,
    max: u64,
    drain: bool,
) -> Result<(TempVideo, blake3::Hash, u64), DetailError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<DetailError>,
{
    let failed = |e: std::io::Error| {
        tracing::error!(error = %e, "writing a temporary video");
        DetailError::GenerationFailed("the video could not be stored".into())
    };
    let mut file = tokio::fs::File::create(temp.path()).await.map_err(failed)?;
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

/// Reads the form of `content_type` from `body`, the video part into `temp`, at most `max`
/// bytes.
pub(crate) async fn read_form<S>(
    temp: TempVideo,
    max: u64,
    content_type: Option<&str>,
    body: S,
) -> Result<Form, DetailError>
where
    S: Stream<Item = Result<Bytes, warp::Error>> + Send + 'static,
{
    let boundary = content_type
        .and_then(|ct| multer::parse_boundary(ct).ok())
        .ok_or_else(|| DetailError::InvalidRequest("the body must be multipart/form-data".into()))?;
    let body = bounded(body, max.saturating_add(MULTIPART_SLACK), max);
    let mut multipart = multer::Multipart::new(body, boundary);
    let mut form = Form::default();
    let mut temp_slot = Some(temp);
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, max))? {
        match field.name() {
            Some("0.video") => {
                let Some(temp) = temp_slot.take() else {
                    return Err(DetailError::InvalidRequest("more than one `0.video` part".into()));
                };
                let chunks = field.map(|r| r.map_err(|e| multipart_error(e, max)));
                let (temp, hash, size) = stream_to_temp(temp, Box::pin(chunks), max, true).await?;
                // Browsers send an empty file part when no file was chosen.
                if size > 0 {
                    form.upload = Some((temp, hash));
                } else {
                    temp_slot = Some(temp);
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
