//! The job API's one error type. Every error the API returns, including 404, 405, 413 and
//! malformed JSON, renders the interface's envelope `{error: {code, message, details}}`.
//!
//! [`ErrorCode`] is the one list of the codes the envelope carries; [`ApiError::code`] names
//! the code of every error, so no code is written as a string anywhere else.

use serde_json::{json, Value as Json};
use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Rejection, Reply};

use crate::jobs::assets::AssetError;
use crate::jobs::userdata::{UserDataError, MAX_FILE_BYTES};

/// Declares [`ErrorCode`]: each code's variant, its name on the wire and its status, and
/// [`ErrorCode::ALL`].
macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal => $status:ident,)*) => {
        /// Every `code` the job API's error envelope carries.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code's name in the envelope.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                }
            }

            /// The HTTP status every error with this code answers with.
            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    /// 422: graph validation failed.
    InvalidWorkflow = "invalid_workflow" => UNPROCESSABLE_ENTITY,
    /// 422: the workflow is in the UI export format.
    WorkflowFormatUi = "workflow_format_ui" => UNPROCESSABLE_ENTITY,
    /// 422: referenced assets are missing or not the caller's.
    MissingAsset = "missing_asset" => UNPROCESSABLE_ENTITY,
    /// 422: the idempotency key was already presented.
    IdempotencyKeyReuse = "idempotency_key_reuse" => UNPROCESSABLE_ENTITY,
    /// 409: the upload does not hash to `expected_hash`.
    HashMismatch = "hash_mismatch" => CONFLICT,
    /// 404: no blob with this hash is available to the caller.
    BlobNotFound = "blob_not_found" => NOT_FOUND,
    /// 404: no such resource, or no such route.
    NotFound = "not_found" => NOT_FOUND,
    /// 405: the route exists but not with this method.
    MethodNotAllowed = "method_not_allowed" => METHOD_NOT_ALLOWED,
    /// 401: missing or invalid credentials.
    Unauthorized = "unauthorized" => UNAUTHORIZED,
    /// 403: authenticated but not allowed.
    Forbidden = "forbidden" => FORBIDDEN,
    /// 402: out of credits.
    InsufficientCredits = "insufficient_credits" => PAYMENT_REQUIRED,
    /// 429: the queue is full.
    QueueFull = "queue_full" => TOO_MANY_REQUESTS,
    /// 429: the deployment is still starting.
    DeploymentNotReady = "deployment_not_ready" => TOO_MANY_REQUESTS,
    /// 422: the deployment was drained by its operator.
    DeploymentStopped = "deployment_stopped" => UNPROCESSABLE_ENTITY,
    /// 429: request bodies being parsed hold the server's parse budget.
    ServerBusy = "server_busy" => TOO_MANY_REQUESTS,
    /// 429: too many open event streams.
    TooManyStreams = "too_many_streams" => TOO_MANY_REQUESTS,
    /// 409: the asset is an output of a live job.
    AssetInUse = "asset_in_use" => CONFLICT,
    /// 413: the body is larger than allowed.
    PayloadTooLarge = "payload_too_large" => PAYLOAD_TOO_LARGE,
    /// 416: the range cannot be satisfied.
    RangeNotSatisfiable = "range_not_satisfiable" => RANGE_NOT_SATISFIABLE,
    /// 500: an unexpected failure.
    UpstreamError = "upstream_error" => INTERNAL_SERVER_ERROR,
    /// 400: the request breaks a rule of its route.
    InvalidRequest = "invalid_request" => BAD_REQUEST,
    /// 400: the body is not JSON.
    InvalidJson = "invalid_json" => BAD_REQUEST,
    /// 400: the multipart body is malformed.
    InvalidMultipart = "invalid_multipart" => BAD_REQUEST,
    /// 400: a header's value cannot be read.
    InvalidHeader = "invalid_header" => BAD_REQUEST,
    /// 400: a header the route needs is absent.
    MissingHeader = "missing_header" => BAD_REQUEST,
    /// 400: the query string cannot be read.
    InvalidQuery = "invalid_query" => BAD_REQUEST,
    /// 400: the route needs a `Content-Length`.
    LengthRequired = "length_required" => BAD_REQUEST,
    /// 400: the body's `Content-Type` is not one the route reads.
    UnsupportedMediaType = "unsupported_media_type" => BAD_REQUEST,
    /// 400: `limit` is out of range.
    InvalidLimit = "invalid_limit" => BAD_REQUEST,
    /// 400: the cursor is not one this server issued, or has expired.
    InvalidCursor = "invalid_cursor" => BAD_REQUEST,
    /// 400: a field reserved for a later version is present.
    ReservedField = "reserved_field" => BAD_REQUEST,
    /// 400: `extra_data` is not an object of the accepted keys.
    InvalidExtraData = "invalid_extra_data" => BAD_REQUEST,
    /// 400: the submit body has no `workflow`.
    MissingWorkflow = "missing_workflow" => BAD_REQUEST,
    /// 400: `expires_in` is not an integer in range.
    InvalidExpiresIn = "invalid_expires_in" => BAD_REQUEST,
    /// 400: the upload has no file part.
    MissingFile = "missing_file" => BAD_REQUEST,
    /// 400: the upload has no `file_path`.
    MissingFilePath = "missing_file_path" => BAD_REQUEST,
    /// 400: a hash is not `blake3:<64 hex digits>`.
    InvalidHash = "invalid_hash" => BAD_REQUEST,
    /// 400: `content_type` is not a media type.
    InvalidContentType = "invalid_content_type" => BAD_REQUEST,
    /// 400: an image cannot be decoded.
    InvalidImage = "invalid_image" => BAD_REQUEST,
    /// 400: a file name breaks the naming rules.
    InvalidFileName = "invalid_file_name" => BAD_REQUEST,
    /// 400: a name is already taken.
    NameTaken = "name_taken" => BAD_REQUEST,
    /// 400: a user data path breaks the naming rules.
    InvalidPath = "invalid_path" => BAD_REQUEST,
    /// 422: the job's metadata breaks a bound.
    MetadataInvalid = "metadata_invalid" => UNPROCESSABLE_ENTITY,
    /// 422: the body has more keys than accepted.
    TooManyKeys = "too_many_keys" => UNPROCESSABLE_ENTITY,
    /// 422: the body has more values than accepted.
    TooManyValues = "too_many_values" => UNPROCESSABLE_ENTITY,
}

/// Every error of the job API; [`ApiError::code`] names its [`ErrorCode`].
#[derive(Debug, Clone)]
pub enum ApiError {
    /// 422: graph validation failed, with per-node details.
    InvalidWorkflow {
        /// What is wrong, for people.
        message: String,
        /// `node_errors` and the other per-node details.
        details: Json,
    },
    /// 422: the workflow is in the UI export format.
    WorkflowFormatUi(String),
    /// 422: referenced assets are missing or not the caller's.
    MissingAsset {
        /// What is missing, for people.
        message: String,
        /// The missing references.
        details: Json,
    },
    /// 422: the idempotency key was already presented.
    IdempotencyKeyReuse {
        /// The job the key first created, when it is the caller's.
        job_id: Option<String>,
    },
    /// 409: the upload does not hash to `expected_hash`.
    HashMismatch {
        /// The hash the caller declared.
        expected: String,
        /// The hash of the bytes received.
        actual: String,
    },
    /// 404: no blob with this hash is available to the caller.
    BlobNotFound,
    /// 404: no such resource (for this caller), or no such route.
    NotFound(String),
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 401: missing or invalid credentials.
    Unauthorized,
    /// 403: authenticated but not allowed.
    Forbidden(String),
    /// 402: out of credits.
    InsufficientCredits {
        /// Credits left.
        balance: i64,
        /// What the job would cost.
        cost: i64,
    },
    /// 429: the queue is full.
    QueueFull {
        /// Seconds to wait before trying again (`Retry-After`).
        retry_after: u64,
    },
    /// 429: the deployment is still starting.
    DeploymentNotReady {
        /// Seconds to wait before trying again (`Retry-After`).
        retry_after: u64,
    },
    /// 422: the deployment was drained by its operator.
    DeploymentStopped,
    /// 429: request bodies being read and parsed hold the server's parse budget.
    ServerBusy {
        /// Seconds to wait before trying again (`Retry-After`).
        retry_after: u64,
    },
    /// 429: too many open event streams.
    TooManyStreams {
        /// Seconds to wait before trying again (`Retry-After`).
        retry_after: u64,
    },
    /// 409: the asset is an output of a live job.
    AssetInUse,
    /// 400: the request breaks a rule of its route; the message says how.
    InvalidRequest(String),
    /// 400: the body is not JSON; the message says how.
    InvalidJson(String),
    /// 400: the multipart body is malformed; the message says how.
    InvalidMultipart(String),
    /// 400: a header's value cannot be read; the message says how.
    InvalidHeader(String),
    /// 400: a header the route needs is absent; the message says how.
    MissingHeader(String),
    /// 400: the query string cannot be read; the message says how.
    InvalidQuery(String),
    /// 400: the route needs a `Content-Length`; the message says how.
    LengthRequired(String),
    /// 400: the body's `Content-Type` is not one the route reads; the message says how.
    UnsupportedMediaType(String),
    /// 400: `limit` is out of range; the message says how.
    InvalidLimit(String),
    /// 400: the cursor is not one this server issued, or has expired; the message says how.
    InvalidCursor(String),
    /// 400: a field reserved for a later version is present; the message says how.
    ReservedField(String),
    /// 400: `extra_data` is not an object of the accepted keys; the message says how.
    InvalidExtraData(String),
    /// 400: the submit body has no `workflow`; the message says how.
    MissingWorkflow(String),
    /// 400: `expires_in` is not an integer in range; the message says how.
    InvalidExpiresIn(String),
    /// 400: the upload has no file part; the message says how.
    MissingFile(String),
    /// 400: the upload has no `file_path`; the message says how.
    MissingFilePath(String),
    /// 400: a hash is not `blake3:<64 hex digits>`; the message says how.
    InvalidHash(String),
    /// 400: `content_type` is not a media type; the message says how.
    InvalidContentType(String),
    /// 400: an image cannot be decoded; the message says how.
    InvalidImage(String),
    /// 400: a file name breaks the naming rules; the message says how.
    InvalidFileName(String),
    /// 400: a name is already taken; the message says how.
    NameTaken(String),
    /// 400: a user data path breaks the naming rules; the message says how.
    InvalidPath(String),
    /// 422: the job's metadata breaks a bound; the message says how.
    MetadataInvalid(String),
    /// 422: the body has more keys than accepted; the message says how.
    TooManyKeys(String),
    /// 422: the body has more values than accepted; the message says how.
    TooManyValues(String),
    /// 413: the body is larger than allowed.
    PayloadTooLarge(String),
    /// 416: the range cannot be satisfied.
    RangeNotSatisfiable {
        /// The content's size in bytes.
        size: u64,
    },
    /// 500: an unexpected failure; the message is generic.
    Upstream,
}

impl ApiError {
    /// Logs an internal failure and returns the generic 500.
    pub fn upstream(context: &str, error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "{context}");
        ApiError::Upstream
    }

    /// The error's code; its status is the code's.
    pub fn code(&self) -> ErrorCode {
        use ApiError::*;
        match self {
            InvalidWorkflow { .. } => ErrorCode::InvalidWorkflow,
            WorkflowFormatUi(_) => ErrorCode::WorkflowFormatUi,
            MissingAsset { .. } => ErrorCode::MissingAsset,
            IdempotencyKeyReuse { .. } => ErrorCode::IdempotencyKeyReuse,
            HashMismatch { .. } => ErrorCode::HashMismatch,
            BlobNotFound => ErrorCode::BlobNotFound,
            NotFound(_) => ErrorCode::NotFound,
            MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Unauthorized => ErrorCode::Unauthorized,
            Forbidden(_) => ErrorCode::Forbidden,
            InsufficientCredits { .. } => ErrorCode::InsufficientCredits,
            QueueFull { .. } => ErrorCode::QueueFull,
            DeploymentNotReady { .. } => ErrorCode::DeploymentNotReady,
            DeploymentStopped => ErrorCode::DeploymentStopped,
            ServerBusy { .. } => ErrorCode::ServerBusy,
            TooManyStreams { .. } => ErrorCode::TooManyStreams,
            AssetInUse => ErrorCode::AssetInUse,
            PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            RangeNotSatisfiable { .. } => ErrorCode::RangeNotSatisfiable,
            Upstream => ErrorCode::UpstreamError,
            InvalidRequest(_) => ErrorCode::InvalidRequest,
            InvalidJson(_) => ErrorCode::InvalidJson,
            InvalidMultipart(_) => ErrorCode::InvalidMultipart,
            InvalidHeader(_) => ErrorCode::InvalidHeader,
            MissingHeader(_) => ErrorCode::MissingHeader,
            InvalidQuery(_) => ErrorCode::InvalidQuery,
            LengthRequired(_) => ErrorCode::LengthRequired,
            UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            InvalidLimit(_) => ErrorCode::InvalidLimit,
            InvalidCursor(_) => ErrorCode::InvalidCursor,
            ReservedField(_) => ErrorCode::ReservedField,
            InvalidExtraData(_) => ErrorCode::InvalidExtraData,
            MissingWorkflow(_) => ErrorCode::MissingWorkflow,
            InvalidExpiresIn(_) => ErrorCode::InvalidExpiresIn,
            MissingFile(_) => ErrorCode::MissingFile,
            MissingFilePath(_) => ErrorCode::MissingFilePath,
            InvalidHash(_) => ErrorCode::InvalidHash,
            InvalidContentType(_) => ErrorCode::InvalidContentType,
            InvalidImage(_) => ErrorCode::InvalidImage,
            InvalidFileName(_) => ErrorCode::InvalidFileName,
            NameTaken(_) => ErrorCode::NameTaken,
            InvalidPath(_) => ErrorCode::InvalidPath,
            MetadataInvalid(_) => ErrorCode::MetadataInvalid,
            TooManyKeys(_) => ErrorCode::TooManyKeys,
            TooManyValues(_) => ErrorCode::TooManyValues,
        }
    }

    /// The envelope's message, for people.
    fn message(&self) -> String {
        use ApiError::*;
        match self {
            InvalidWorkflow { message, .. } | MissingAsset { message, .. } => message.clone(),
            IdempotencyKeyReuse { job_id: Some(id) } => {
                format!("this Idempotency-Key was already used; it created job {id}, poll that job instead of resubmitting")
            }
            IdempotencyKeyReuse { job_id: None } => "this Idempotency-Key was already used".into(),
            HashMismatch { expected, actual } => format!("the upload hashes to {actual}, not the expected {expected}"),
            BlobNotFound => "no blob with this hash is available to you".into(),
            NotFound(what) => format!("{what} not found"),
            MethodNotAllowed => "this method is not allowed on this route".into(),
            Unauthorized => "missing or invalid credentials: send Authorization: Bearer <key>".into(),
            InsufficientCredits { balance, cost } => format!("a job costs {cost} credit(s) and the balance is {balance}"),
            QueueFull { .. } => "the job queue is full; retry after the indicated delay".into(),
            DeploymentNotReady { .. } => "the deployment is still starting; retry after the indicated delay".into(),
            DeploymentStopped => "the deployment has been stopped by its operator and accepts no new jobs".into(),
            ServerBusy { .. } => {
                "the server is reading and parsing as many request bodies as it can hold; retry after the indicated delay".into()
            }
            TooManyStreams { .. } => "too many open event streams; poll the job or retry later".into(),
            AssetInUse => "the asset is an output of a job that still exists".into(),
            RangeNotSatisfiable { size } => format!("the requested range is outside the content's {size} bytes"),
            Upstream => "an unexpected error occurred; please retry later".into(),
            WorkflowFormatUi(m) | Forbidden(m) | PayloadTooLarge(m) => m.clone(),
            InvalidRequest(m)
            | InvalidJson(m)
            | InvalidMultipart(m)
            | InvalidHeader(m)
            | MissingHeader(m)
            | InvalidQuery(m)
            | LengthRequired(m)
            | UnsupportedMediaType(m)
            | InvalidLimit(m)
            | InvalidCursor(m)
            | ReservedField(m)
            | InvalidExtraData(m)
            | MissingWorkflow(m)
            | InvalidExpiresIn(m)
            | MissingFile(m)
            | MissingFilePath(m)
            | InvalidHash(m)
            | InvalidContentType(m)
            | InvalidImage(m)
            | InvalidFileName(m)
            | NameTaken(m)
            | InvalidPath(m)
            | MetadataInvalid(m)
            | TooManyKeys(m)
            | TooManyValues(m) => m.clone(),
        }
    }

    /// The envelope's details: what a client acts on, or null.
    fn details(&self) -> Json {
        match self {
            ApiError::InvalidWorkflow { details, .. } | ApiError::MissingAsset { details, .. } => details.clone(),
            ApiError::IdempotencyKeyReuse { job_id } => json!({"job_id": job_id}),
            ApiError::HashMismatch { expected, actual } => json!({"expected_hash": expected, "actual_hash": actual}),
            ApiError::InsufficientCredits { balance, cost } => json!({"balance": balance, "cost": cost}),
            ApiError::RangeNotSatisfiable { size } => json!({"size_bytes": size}),
            _ => Json::Null,
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull { retry_after }
            | ApiError::DeploymentNotReady { retry_after }
            | ApiError::TooManyStreams { retry_after }
            | ApiError::ServerBusy { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}

impl warp::reject::Reject for ApiError {}

impl From<AssetError> for ApiError {
    fn from(e: AssetError) -> Self {
        match e {
            AssetError::HashMismatch { expected, actual } => ApiError::HashMismatch {
                expected: format!("blake3:{expected}"),
                actual: format!("blake3:{actual}"),
            },
            AssetError::BlobNotFound => ApiError::BlobNotFound,
            AssetError::InUse => ApiError::AssetInUse,
            AssetError::Failed { doing, message } => ApiError::upstream(doing, message),
        }
    }
}

impl From<UserDataError> for ApiError {
    fn from(e: UserDataError) -> Self {
        match e {
            UserDataError::SettingsTooLarge => {
                ApiError::PayloadTooLarge(format!("settings are limited to {} MiB", MAX_FILE_BYTES >> 20))
            }
            UserDataError::Store { doing, error } => ApiError::upstream(doing, error),
        }
    }
}

impl Reply for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let body = json!({"error": {"code": code.as_str(), "message": self.message(), "details": self.details()}});
        let mut response = warp::reply::with_status(warp::reply::json(&body), code.status()).into_response();
        if let Some(secs) = self.retry_after() {
            response.headers_mut().insert("retry-after", HeaderValue::from(secs));
        }
        if let ApiError::RangeNotSatisfiable { size } = self {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                response.headers_mut().insert("content-range", v);
            }
        }
        response
    }
}

/// Maps every rejection, ours and warp's, to the envelope.
pub async fn recover(rejection: Rejection) -> Result<Response, std::convert::Infallible> {
    let error = if let Some(e) = rejection.find::<ApiError>() {
        e.clone()
    } else if rejection.is_not_found() {
        ApiError::NotFound("route".into())
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        ApiError::PayloadTooLarge("the request body is larger than this route accepts".into())
    } else if rejection.find::<warp::reject::LengthRequired>().is_some() {
        ApiError::LengthRequired("this route needs a Content-Length".into())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        ApiError::InvalidHeader(e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::MissingHeader>() {
        ApiError::MissingHeader(e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidQuery>() {
        ApiError::InvalidQuery(e.to_string())
    } else if rejection.find::<warp::reject::UnsupportedMediaType>().is_some() {
        ApiError::UnsupportedMediaType("unsupported Content-Type for this route".into())
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        // Last: a rejection combines every route's, and the other routes of a path refuse
        // the method; any other reason is the one the matching route gave.
        ApiError::MethodNotAllowed
    } else {
        tracing::warn!(?rejection, "unhandled rejection");
        ApiError::Upstream
    };
    Ok(error.into_response())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The status and the body text of `reply`'s response.
    pub(crate) async fn rendered(reply: impl Reply) -> (StatusCode, String) {
        let response = reply.into_response();
        let status = response.status();
        let bytes = warp::hyper::body::to_bytes(response.into_body()).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[test]
    fn every_code_has_its_own_snake_case_name() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert!(names
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "two codes share a name");
    }

    #[tokio::test]
    async fn an_error_renders_its_codes_name_and_status_in_the_envelope() {
        let (status, body) = rendered(ApiError::InvalidMultipart("a text field is not UTF-8".into())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            r#"{"error":{"code":"invalid_multipart","message":"a text field is not UTF-8","details":null}}"#
        );
        let (status, body) = rendered(ApiError::TooManyKeys("too many".into())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            body,
            r#"{"error":{"code":"too_many_keys","message":"too many","details":null}}"#
        );
    }

    #[tokio::test]
    async fn structured_errors_keep_their_details_and_headers() {
        let response = ApiError::QueueFull { retry_after: 3 }.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "3");
        let (status, body) = rendered(ApiError::RangeNotSatisfiable { size: 10 }).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(
            body,
            r#"{"error":{"code":"range_not_satisfiable","message":"the requested range is outside the content's 10 bytes","details":{"size_bytes":10}}}"#
        );
    }
}
