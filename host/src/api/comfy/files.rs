//! `GET /view`, `POST /upload/image` and `POST /upload/mask`: ComfyUI's file names over the
//! tenant's assets (see [`super::names`]).

use std::sync::Arc;

use bytes::Buf;
use futures::{StreamExt, TryStreamExt};
use serde_json::{json, Value as Json};
use warp::filters::multipart::{FormData, Part};
use warp::filters::BoxedFilter;
use warp::http::{HeaderValue, StatusCode};
use warp::Filter;

use super::names::{self, FileRef, FolderType};
use super::prompt::find_file;
use super::{answer, json_reply, with_caller};
use crate::api::assets::{content_safety_headers, multipart_error, part_text, upload_limit};
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::jobs::assets::UploadDetails;

/// Largest mask upload: it is composited in memory.
const MAX_MASK_BYTES: u64 = 64 << 20;
/// Most ` (n)` suffixes tried to find a free upload name.
const MAX_RENAMES: usize = 1_000;
/// Largest decoded image a conversion (`/view`'s `channel` and `preview`, a mask's
/// composition) takes on: 256 MiB, a 8192x8192 RGBA image.
const MAX_CONVERT_ALLOC: u64 = 256 << 20;
/// Conversions that run at once; more wait their turn, so the memory they take stays bounded.
static CONVERSIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Decodes `bytes` (an image named `what` in errors) within [`MAX_CONVERT_ALLOC`].
fn decode_bounded(bytes: &[u8], what: &str) -> Result<image::DynamicImage, ApiError> {
    let undecodable = |e: &dyn std::fmt::Display| ApiError::InvalidImage(format!("{what} cannot be decoded: {e}"));
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| undecodable(&e))?;
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_CONVERT_ALLOC);
    reader.limits(limits);
    reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => ApiError::PayloadTooLarge(format!(
            "{what} is too large to convert (over {} MiB decoded)",
            MAX_CONVERT_ALLOC >> 20
        )),
        e => undecodable(&e),
    })
}

/// 413 for a stored file over [`MAX_CONVERT_ALLOC`]: a conversion reads it whole.
fn refuse_over_conversion_size(asset: &crate::jobs::AssetRecord, what: &str) -> Result<(), ApiError> {
    if asset.size_bytes.max(0) as u64 > MAX_CONVERT_ALLOC {
        return Err(ApiError::PayloadTooLarge(format!(
            "{what} is over {} MiB: files that large are served only as stored",
            MAX_CONVERT_ALLOC >> 20
        )));
    }
    Ok(())
}

/// What `/view` sends instead of the stored file: ComfyUI's `preview=FORMAT;QUALITY` (a JPEG,
/// or a lossless WebP) or `channel=rgb|a` (a PNG of the colours, or of the alpha alone).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conversion {
    Jpeg(u8),
    Webp,
    Rgb,
    Alpha,
}

impl Conversion {
    /// From `/view`'s query, as ComfyUI reads it: `preview` first, then `channel`; `None`
    /// for the file as stored.
    fn from_query(query: &std::collections::HashMap<String, String>) -> Result<Option<Self>, ApiError> {
        if let Some(preview) = query.get("preview") {
            let mut parts = preview.split(';');
            let format = parts.next().unwrap_or("");
            let quality = match parts.next_back() {
                Some(q) => q
                    .trim()
                    .parse::<u8>()
                    .ok()
                    .filter(|q| (1..=100).contains(q))
                    .ok_or_else(|| ApiError::InvalidRequest("preview quality must be 1 to 100".into()))?,
                None => 90,
            };
            return Ok(Some(if format == "jpeg" {
                Conversion::Jpeg(quality)
            } else {
                Conversion::Webp
            }));
        }
        match query.get("channel").map(String::as_str) {
            None | Some("rgba") => Ok(None),
            Some("rgb") => Ok(Some(Conversion::Rgb)),
            Some("a") => Ok(Some(Conversion::Alpha)),
            Some(_) => Err(ApiError::InvalidRequest("channel must be rgba, rgb or a".into())),
        }
    }

    /// Converts image `bytes`: the new bytes and their content type.
    fn apply(self, bytes: &[u8]) -> Result<(Vec<u8>, &'static str), ApiError> {
        let image = decode_bounded(bytes, "the file")?;
        let mut out = Vec::new();
        let mut cursor = std::io::Cursor::new(&mut out);
        let encoded = match self {
            Conversion::Jpeg(quality) => image
                .to_rgb8()
                .write_with_encoder(image::codecs::jpeg::JpegEncoder::new_with_quality(&mut cursor, quality)),
            Conversion::Webp => image
                .to_rgba8()
                .write_with_encoder(image::codecs::webp::WebPEncoder::new_lossless(&mut cursor)),
            Conversion::Rgb => image.to_rgb8().write_to(&mut cursor, image::ImageFormat::Png),
            Conversion::Alpha => {
                let mut alpha = image.to_rgba8();
                for pixel in alpha.pixels_mut() {
                    pixel.0[..3].fill(0);
                }
                alpha.write_to(&mut cursor, image::ImageFormat::Png)
            }
        };
        encoded.map_err(|e| ApiError::upstream("encoding a converted image", e))?;
        let content_type = match self {
            Conversion::Jpeg(_) => "image/jpeg",
            Conversion::Webp => "image/webp",
            Conversion::Rgb | Conversion::Alpha => "image/png",
        };
        Ok((out, content_type))
    }
}

/// The routes.
pub(super) fn routes(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let view = warp::path("view")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and(warp::query::<std::collections::HashMap<String, String>>())
        .and_then(|s, c, q| async move { answer(view(s, c, q).await) });
    let upload = |path: &'static str, mask: bool| {
        warp::path("upload")
            .and(warp::path(path))
            .and(warp::path::end())
            .and(warp::post())
            .and(with_caller(state))
            .and(upload_limit(state.config.max_upload_bytes))
            .and(warp::multipart::form().max_length(None))
            .and_then(move |s, c, f| async move { answer(upload(s, c, f, mask).await) })
    };
    view.or(upload("image", false))
        .unify()
        .or(upload("mask", true))
        .unify()
        .boxed()
}

fn refused(message: String) -> ApiError {
    ApiError::InvalidFileName(message)
}

async fn view(
    state: Arc<AppState>,
    caller: Caller,
    query: std::collections::HashMap<String, String>,
) -> Result<warp::reply::Response, ApiError> {
    let filename = query
        .get("filename")
        .ok_or_else(|| ApiError::InvalidRequest("filename is required".into()))?;
    let kind = FolderType::parse(query.get("type").map(String::as_str), FolderType::Output).map_err(refused)?;
    let subfolder = query.get("subfolder").map(String::as_str).unwrap_or("");
    let file = names::resolve(filename, subfolder, kind).map_err(refused)?;
    let conversion = Conversion::from_query(&query)?;
    let asset = find_file(&state, &caller.tenant, &file)
        .await?
        .ok_or(ApiError::NotFound("file".into()))?;
    if let Some(conversion) = conversion {
        refuse_over_conversion_size(&asset, "the file")?;
        let _turn = CONVERSIONS
            .acquire()
            .await
            .map_err(|e| ApiError::upstream("waiting to convert an image", e))?;
        let bytes = state.assets.read_all(&asset).await?;
        let (converted, content_type) = tokio::task::spawn_blocking(move || conversion.apply(&bytes))
            .await
            .map_err(|e| ApiError::upstream("converting an image", e))??;
        let mut response = warp::http::Response::new(warp::hyper::Body::from(converted));
        let headers = response.headers_mut();
        headers.insert("cache-control", HeaderValue::from_static("private, max-age=60"));
        content_safety_headers(headers, content_type, &asset.file_path);
        return Ok(response);
    }
    let body = state.assets.read(&asset, 0..asset.size_bytes.max(0) as u64).await?;
    let mut response = warp::http::Response::new(warp::hyper::Body::wrap_stream(body));
    let headers = response.headers_mut();
    headers.insert("content-length", HeaderValue::from(asset.size_bytes.max(0) as u64));
    headers.insert("cache-control", HeaderValue::from_static("private, max-age=60"));
    content_safety_headers(headers, &asset.content_type, &asset.file_path);
    Ok(response)
}

/// The parts of an upload form.
#[derive(Default)]
struct Form {
    /// The image's file name.
    filename: Option<String>,
    /// Streamed to a blob (`/upload/image`).
    streamed: Option<(crate::jobs::assets::Upload, String)>,
    /// Held in memory (`/upload/mask`).
    held: Option<Vec<u8>>,
    overwrite: bool,
    subfolder: String,
    kind: Option<String>,
    original_ref: Option<String>,
}

async fn read_image(state: &AppState, part: Part, form: &mut Form, mask: bool) -> Result<(), ApiError> {
    form.filename = part.filename().map(String::from);
    let limit = if mask {
        state.config.max_upload_bytes.min(MAX_MASK_BYTES)
    } else {
        state.config.max_upload_bytes
    };
    let too_large = || ApiError::PayloadTooLarge(format!("uploads are limited to {limit} bytes"));
    let mut stream = part.stream();
    if mask {
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(multipart_error)?;
            if bytes.len() as u64 + chunk.remaining() as u64 > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(chunk.chunk());
        }
        form.held = Some(bytes);
    } else {
        let mut upload = state.assets.receive().await?;
        let mut hasher = blake3::Hasher::new();
        while let Some(chunk) = stream.next().await {
            let mut chunk = chunk.map_err(multipart_error)?;
            if upload.size() + chunk.remaining() as u64 > limit {
                return Err(too_large());
            }
            let chunk = chunk.copy_to_bytes(chunk.remaining());
            hasher.update(&chunk);
            upload.write(chunk).await?;
        }
        form.streamed = Some((upload, hasher.finalize().to_hex().to_string()));
    }
    Ok(())
}

async fn upload(
    state: Arc<AppState>,
    caller: Caller,
    mut multipart: FormData,
    mask: bool,
) -> Result<warp::reply::Response, ApiError> {
    state.jobs()?;
    let mut form = Form::default();
    while let Some(part) = multipart.try_next().await.map_err(multipart_error)? {
        match part.name() {
            "image" => read_image(&state, part, &mut form, mask).await?,
            "overwrite" => form.overwrite = matches!(part_text(part).await?.as_str(), "true" | "1"),
            "subfolder" => form.subfolder = part_text(part).await?,
            "type" => form.kind = Some(part_text(part).await?),
            "original_ref" => form.original_ref = Some(part_text(part).await?),
            _ => {
                part_text(part).await?;
            }
        }
    }
    let filename = form
        .filename
        .clone()
        .filter(|f| !f.is_empty())
        .ok_or_else(|| ApiError::MissingFile("the upload needs an `image` file part with a file name".into()))?;
    names::check(&filename, "the file name", true).map_err(refused)?;
    if filename.contains('/') || filename.contains('\\') {
        return Err(refused("the file name must not contain a path separator".into()));
    }
    names::check(&form.subfolder, "subfolder", false).map_err(refused)?;
    let kind = FolderType::parse(form.kind.as_deref(), FolderType::Input).map_err(refused)?;
    let (upload, hash) = if mask {
        let image = form
            .held
            .take()
            .ok_or_else(|| ApiError::MissingFile("the upload needs an `image` file part".into()))?;
        let original = form
            .original_ref
            .as_deref()
            .ok_or_else(|| ApiError::InvalidRequest("a mask upload needs original_ref".into()))?;
        let composed = compose_mask(&state, &caller.tenant, original, &image).await?;
        let hash = blake3::hash(&composed).to_hex().to_string();
        let mut upload = state.assets.receive().await?;
        upload.write(composed.into()).await?;
        (upload, hash)
    } else {
        form.streamed
            .take()
            .ok_or_else(|| ApiError::MissingFile("the upload needs an `image` file part".into()))?
    };
    // Like ComfyUI: without overwrite a taken name gets ` (n)`, unless it holds these bytes.
    let (stem, extension) = match filename.rfind('.') {
        Some(dot) if dot > 0 => (&filename[..dot], &filename[dot..]),
        _ => (filename.as_str(), ""),
    };
    let mut name = filename.clone();
    let mut duplicate = false;
    if !form.overwrite {
        let mut n = 0;
        loop {
            let key = names::upload_key(kind, &form.subfolder, &name);
            match state
                .store
                .upload_named(&caller.tenant, &key)
                .await
                .map_err(|e| ApiError::upstream("finding an upload", e))?
            {
                None => break,
                Some(existing) if existing.blob == hash => {
                    duplicate = true;
                    break;
                }
                Some(_) => {
                    n += 1;
                    if n > MAX_RENAMES {
                        return Err(ApiError::NameTaken(format!(
                            "{filename:?} and its first {MAX_RENAMES} numbered variants are taken"
                        )));
                    }
                    name = format!("{stem} ({n}){extension}");
                }
            }
        }
    }
    if !duplicate {
        let details = UploadDetails {
            tenant: caller.tenant.clone(),
            file_path: names::upload_key(kind, &form.subfolder, &name),
            content_type: None,
            tags: Vec::new(),
            expires_at: None,
            expected_hash: None,
        };
        state.assets.upload(upload, details).await?;
    }
    Ok(json_reply(
        StatusCode::OK,
        &json!({"name": name, "subfolder": form.subfolder, "type": kind.as_str()}),
    ))
}

/// The original image `original_ref` names with the mask's alpha as its alpha, as PNG.
async fn compose_mask(state: &AppState, tenant: &str, original_ref: &str, mask: &[u8]) -> Result<Vec<u8>, ApiError> {
    let bad = ApiError::InvalidRequest;
    let original: Json =
        serde_json::from_str(original_ref).map_err(|e| bad(format!("original_ref is not JSON: {e}")))?;
    let field = |name: &str| original.get(name).and_then(Json::as_str).unwrap_or("");
    let kind = FolderType::parse(Some(field("type")), FolderType::Output).map_err(refused)?;
    let file: FileRef = names::resolve(field("filename"), field("subfolder"), kind).map_err(refused)?;
    let asset = find_file(state, tenant, &file)
        .await?
        .ok_or(ApiError::NotFound("the original image".into()))?;
    // As `/view` does: the size is checked, and the turn taken, before a byte is read.
    refuse_over_conversion_size(&asset, "the original image")?;
    let _turn = CONVERSIONS
        .acquire()
        .await
        .map_err(|e| ApiError::upstream("waiting to compose a mask", e))?;
    let original = state.assets.read_all(&asset).await?;
    let mask = mask.to_vec();
    tokio::task::spawn_blocking(move || -> Result<Vec<u8>, ApiError> {
        let bad = ApiError::InvalidImage;
        let mut image = decode_bounded(&original, "the original image")?.to_rgba8();
        let mask = decode_bounded(&mask, "the mask")?.to_rgba8();
        if mask.dimensions() != image.dimensions() {
            return Err(bad(format!(
                "the mask is {:?} pixels, the original image {:?}",
                mask.dimensions(),
                image.dimensions()
            )));
        }
        for (pixel, m) in image.pixels_mut().zip(mask.pixels()) {
            pixel.0[3] = m.0[3];
        }
        let mut png = Vec::new();
        image
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| ApiError::upstream("encoding the masked image", e))?;
        Ok(png)
    })
    .await
    .map_err(|e| ApiError::upstream("composing a mask", e))?
}
