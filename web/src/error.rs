use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use thiserror::Error;

/// Everything an API handler can answer besides success. The one place errors become HTTP
/// statuses; internal details are logged, never sent.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
    /// Too many requests of a kind are being served at once: 503 with `Retry-After`.
    #[error("{message}")]
    Busy { message: String, retry_after_seconds: u64 },
    #[error("internal error")]
    Internal(#[from] lagscope_store::StoreError),
    #[error("internal error")]
    Analysis(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Busy { retry_after_seconds, .. } => {
                let retry_after = [(axum::http::header::RETRY_AFTER, retry_after_seconds.to_string())];
                let body = Json(json!({ "error": self.to_string() }));
                return (StatusCode::SERVICE_UNAVAILABLE, retry_after, body).into_response();
            }
            Self::Analysis(error) => {
                tracing::error!(%error, "lag analytics failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::Internal(error) => {
                tracing::error!(%error, "api request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}
