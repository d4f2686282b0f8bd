//! The endpoint's errors before its stream starts: `{"detail": {"code", "message"}}`.

use serde_json::json;
use warp::http::{header, HeaderValue, StatusCode};
use warp::Reply;
use weft_v2m::V2mError;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_render_detail() {
        let e = DetailError::VideoTooLong("long".into());
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.code(), "video_too_long");
        let e: DetailError = V2mError::UnreadableVideo("x".into()).into();
        assert_eq!(e.code(), "unsupported_video");
        assert_eq!(DetailError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
    }
}
