//! The ComfyUI routes' one error type: ComfyUI's own bodies where ComfyUI's clients read
//! them (a refused prompt, a user data file that exists, a user that cannot be made), and
//! the job API's envelope for every other error.

use serde_json::{json, Value as Json};
use warp::http::StatusCode;
use warp::reply::Response;
use warp::Reply;

use super::json_reply;
use crate::api::error::ApiError;
use crate::jobs::userdata::UserDataError;

/// Why a ComfyUI route refused a request.
#[derive(Debug)]
pub(super) enum ComfyError {
    /// 400 `{error: {type, message, details, extra_info: {}}, node_errors}`: ComfyUI's answer
    /// to a prompt it will not queue.
    PromptRejected(Box<PromptRejection>),
    /// 409 `{"error": "File already exists"}`: a user data write that may not overwrite.
    FileExists,
    /// 400 `{"error": ...}`: `POST /users`; weft's users are its tenants.
    UsersAreTenants,
    /// Any other error, in the job API's envelope.
    Api(ApiError),
}

/// Why a prompt was not queued, in ComfyUI's terms.
#[derive(Debug)]
pub(super) struct PromptRejection {
    /// ComfyUI's error type (`invalid_prompt`, `no_prompt`, a validation reason, ...).
    kind: String,
    /// What is wrong, for people.
    message: String,
    /// More of it (each node error on its line), or empty.
    details: String,
    /// The errors by node, in ComfyUI's shape (`{}` when none).
    node_errors: Json,
}

impl ComfyError {
    /// A refused prompt with no errors by node.
    pub(super) fn prompt(kind: &str, message: &str, details: &str) -> Self {
        Self::prompt_with_nodes(kind, message, details, json!({}))
    }

    /// A refused prompt with `node_errors`.
    pub(super) fn prompt_with_nodes(kind: &str, message: &str, details: &str, node_errors: Json) -> Self {
        ComfyError::PromptRejected(Box::new(PromptRejection {
            kind: kind.to_string(),
            message: message.to_string(),
            details: details.to_string(),
            node_errors,
        }))
    }
}

impl From<ApiError> for ComfyError {
    fn from(error: ApiError) -> Self {
        ComfyError::Api(error)
    }
}

impl From<UserDataError> for ComfyError {
    fn from(error: UserDataError) -> Self {
        ComfyError::Api(error.into())
    }
}

impl Reply for ComfyError {
    fn into_response(self) -> Response {
        match self {
            ComfyError::PromptRejected(rejection) => {
                let PromptRejection {
                    kind,
                    message,
                    details,
                    node_errors,
                } = *rejection;
                json_reply(
                    StatusCode::BAD_REQUEST,
                    &json!({
                        "error": {"type": kind, "message": message, "details": details, "extra_info": {}},
                        "node_errors": node_errors,
                    }),
                )
            }
            ComfyError::FileExists => json_reply(StatusCode::CONFLICT, &json!({"error": "File already exists"})),
            ComfyError::UsersAreTenants => json_reply(
                StatusCode::BAD_REQUEST,
                &json!({"error": "users are weft tenants: create an API key with `weft keys create --tenant NAME`"}),
            ),
            ComfyError::Api(error) => error.into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::tests::rendered;

    #[tokio::test]
    async fn a_refused_prompt_answers_comfyuis_400_body() {
        let (status, text) = rendered(ComfyError::prompt(
            "no_prompt",
            "No prompt provided",
            "No prompt provided",
        ))
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            r#"{"error":{"type":"no_prompt","message":"No prompt provided","details":"No prompt provided","extra_info":{}},"node_errors":{}}"#
        );
    }

    #[tokio::test]
    async fn an_existing_file_answers_comfyuis_409_body() {
        let (status, text) = rendered(ComfyError::FileExists).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(text, r#"{"error":"File already exists"}"#);
    }

    #[tokio::test]
    async fn other_errors_answer_the_job_apis_envelope() {
        let (status, text) = rendered(ComfyError::from(ApiError::InvalidPath("the path is empty".into()))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            r#"{"error":{"code":"invalid_path","message":"the path is empty","details":null}}"#
        );
    }
}
