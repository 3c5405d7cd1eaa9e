//! Errors as the LangGraph Platform answers them: a status code and `{"detail": …}`.

use axum::Json;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// A request that failed, with the status it is answered with.
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong and, where it helps, what to do.
    pub detail: String,
}

impl ApiError {
    /// A 404 for `what` (a thread, a run, an assistant…).
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            detail: format!("{what} not found"),
        }
    }

    /// A 409: the request conflicts with what is there (a busy thread, an existing id).
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            detail: detail.into(),
        }
    }

    /// A 422: the payload cannot be used.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            detail: detail.into(),
        }
    }

    /// A 500: storage or the agent failed.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            detail: detail.to_string(),
        }
    }

    /// A 503: the server could not take the request in now; sending it again may work.
    #[cfg(feature = "cluster")]
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            detail: detail.into(),
        }
    }

    /// A 401: no or an unknown API key.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            detail: "missing or unknown API key; send it as `x-api-key` or `Authorization: Bearer`"
                .to_owned(),
        }
    }
}

impl From<deepagents::backends::store::StoreError> for ApiError {
    fn from(error: deepagents::backends::store::StoreError) -> Self {
        match error {
            deepagents::backends::store::StoreError::InvalidNamespace { .. }
            | deepagents::backends::store::StoreError::InvalidKey { .. } => {
                Self::invalid(error.to_string())
            }
            other => Self::internal(other),
        }
    }
}

impl From<deepagents::core::CheckpointError> for ApiError {
    fn from(error: deepagents::core::CheckpointError) -> Self {
        use deepagents::core::CheckpointError as E;
        match error {
            E::Busy { .. } => Self::conflict(error.to_string()),
            E::NotFound { .. } => Self {
                status: StatusCode::NOT_FOUND,
                detail: error.to_string(),
            },
            E::InvalidThreadId { .. } => Self::invalid(error.to_string()),
            E::AlreadyExists { .. } => Self::conflict(error.to_string()),
            other => Self::internal(other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(serde_json::json!({ "detail": &self.detail })),
        )
            .into_response();
        response.extensions_mut().insert(Refusal(self.detail));
        response
    }
}

/// Why a handler refused a request, kept on the response for [`log_refusals`].
#[derive(Clone)]
struct Refusal(String);

/// Logs every request answered with an error status — its method, path, status and reason —
/// so an operator sees why a client's call failed without reading the client.
pub(crate) async fn log_refusals(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let reason = response.extensions().get::<Refusal>().map_or_else(
            // Refused before a handler ran: an unknown route or method, an unreadable body.
            || status.canonical_reason().unwrap_or("refused").to_owned(),
            |refusal| refusal.0.clone(),
        );
        if status.is_server_error() {
            tracing::error!(%method, path, status = status.as_u16(), reason, "request failed");
        } else {
            tracing::warn!(%method, path, status = status.as_u16(), reason, "request refused");
        }
    }
    response
}

/// What handlers return.
pub type ApiResult<T> = Result<T, ApiError>;
