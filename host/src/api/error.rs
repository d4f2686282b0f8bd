//! The job API's one error type. Every error the API returns, including 404, 405, 413 and
//! malformed JSON, renders the interface's envelope `{error: {code, message, details}}`.

use serde_json::{json, Value as Json};
use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Rejection, Reply};

use crate::jobs::assets::AssetError;

/// Every error code of the job API.
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
    /// 400: the request is malformed.
    BadRequest {
        /// The error code.
        code: &'static str,
        /// What is wrong, for people.
        message: String,
    },
    /// 422: the request is well formed but a field breaks a rule (for example `metadata_invalid`).
    Unprocessable {
        /// The error code.
        code: &'static str,
        /// What is wrong, for people.
        message: String,
    },
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
    /// A 400 with `code` and `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// Logs an internal failure and returns the generic 500.
    pub fn upstream(context: &str, error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "{context}");
        ApiError::Upstream
    }

    fn parts(&self) -> (StatusCode, &'static str, String, Json) {
        use ApiError::*;
        match self {
            InvalidWorkflow { message, details } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_workflow", message.clone(), details.clone()),
            WorkflowFormatUi(m) => (StatusCode::UNPROCESSABLE_ENTITY, "workflow_format_ui", m.clone(), Json::Null),
            MissingAsset { message, details } => (StatusCode::UNPROCESSABLE_ENTITY, "missing_asset", message.clone(), details.clone()),
            IdempotencyKeyReuse { job_id } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reuse",
                match job_id {
                    Some(id) => format!("this Idempotency-Key was already used; it created job {id}, poll that job instead of resubmitting"),
                    None => "this Idempotency-Key was already used".to_string(),
                },
                json!({"job_id": job_id}),
            ),
            HashMismatch { expected, actual } => (
                StatusCode::CONFLICT,
                "hash_mismatch",
                format!("the upload hashes to {actual}, not the expected {expected}"),
                json!({"expected_hash": expected, "actual_hash": actual}),
            ),
            BlobNotFound => (StatusCode::NOT_FOUND, "blob_not_found", "no blob with this hash is available to you".into(), Json::Null),
            NotFound(what) => (StatusCode::NOT_FOUND, "not_found", format!("{what} not found"), Json::Null),
            MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this method is not allowed on this route".into(), Json::Null),
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "missing or invalid credentials: send Authorization: Bearer <key>".into(), Json::Null),
            Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m.clone(), Json::Null),
            InsufficientCredits { balance, cost } => (
                StatusCode::PAYMENT_REQUIRED,
                "insufficient_credits",
                format!("a job costs {cost} credit(s) and the balance is {balance}"),
                json!({"balance": balance, "cost": cost}),
            ),
            QueueFull { .. } => (StatusCode::TOO_MANY_REQUESTS, "queue_full", "the job queue is full; retry after the indicated delay".into(), Json::Null),
            DeploymentNotReady { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "deployment_not_ready",
                "the deployment is still starting; retry after the indicated delay".into(),
                Json::Null,
            ),
            DeploymentStopped => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "deployment_stopped",
                "the deployment has been stopped by its operator and accepts no new jobs".into(),
                Json::Null,
            ),
            ServerBusy { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "server_busy",
                "the server is reading and parsing as many request bodies as it can hold; retry after the indicated delay".into(),
                Json::Null,
            ),
            TooManyStreams { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                "too many open event streams; poll the job or retry later".into(),
                Json::Null,
            ),
            AssetInUse => (StatusCode::CONFLICT, "asset_in_use", "the asset is an output of a job that still exists".into(), Json::Null),
            BadRequest { code, message } => (StatusCode::BAD_REQUEST, code, message.clone(), Json::Null),
            Unprocessable { code, message } => (StatusCode::UNPROCESSABLE_ENTITY, code, message.clone(), Json::Null),
            PayloadTooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", m.clone(), Json::Null),
            RangeNotSatisfiable { size } => (
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the requested range is outside the content's {size} bytes"),
                json!({"size_bytes": size}),
            ),
            Upstream => (StatusCode::INTERNAL_SERVER_ERROR, "upstream_error", "an unexpected error occurred; please retry later".into(), Json::Null),
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

    /// The error code.
    pub fn code(&self) -> &'static str {
        self.parts().1
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

impl Reply for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message, details) = self.parts();
        let body = json!({"error": {"code": code, "message": message, "details": details}});
        let mut response = warp::reply::with_status(warp::reply::json(&body), status).into_response();
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
        ApiError::bad_request("length_required", "this route needs a Content-Length")
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        ApiError::bad_request("invalid_header", e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::MissingHeader>() {
        ApiError::bad_request("missing_header", e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidQuery>() {
        ApiError::bad_request("invalid_query", e.to_string())
    } else if rejection.find::<warp::reject::UnsupportedMediaType>().is_some() {
        ApiError::bad_request("unsupported_media_type", "unsupported Content-Type for this route")
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
