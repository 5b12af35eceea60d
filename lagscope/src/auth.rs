//! Bearer tokens for ingest and the API (off unless tokens are configured).
//!
//! `[auth] ingest_tokens` guards the OTLP receivers (HTTP: 401 with `WWW-Authenticate: Bearer`
//! and an OTLP error body in the request's encoding; gRPC: `UNAUTHENTICATED`);
//! `[auth] api_tokens` guards the API and `/metrics`, except `GET /api/v1/health`, which
//! load balancers and orchestrators probe without credentials. Tokens are compared in time
//! independent of where they differ.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Tokens accepted by the OTLP receivers (`Authorization: Bearer TOKEN`); none = open.
    pub ingest_tokens: Vec<String>,
    /// Tokens accepted by the API and `/metrics`; none = open.
    pub api_tokens: Vec<String>,
}

impl AuthConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (field, tokens) in [("auth.ingest_tokens", &self.ingest_tokens), ("auth.api_tokens", &self.api_tokens)] {
            if let Some(short) = tokens.iter().find(|token| token.len() < 16) {
                return Err(format!(
                    "{field}: a token of {} characters is too easy to guess; use at least 16",
                    short.chars().count()
                ));
            }
        }
        Ok(())
    }
}

/// The tokens one listener accepts.
#[derive(Debug, Clone)]
struct Tokens(Arc<Vec<Vec<u8>>>);

impl Tokens {
    fn new(tokens: &[String]) -> Option<Self> {
        (!tokens.is_empty()).then(|| Self(Arc::new(tokens.iter().map(|token| token.as_bytes().to_vec()).collect())))
    }

    /// `Ok` when the request carries one of the tokens; else what was wrong.
    fn check(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err("missing Authorization header: send Authorization: Bearer <token>");
        };
        let value = value.as_bytes();
        let Some(presented) = value.strip_prefix(b"Bearer ").or_else(|| value.strip_prefix(b"bearer ")) else {
            return Err("the Authorization header is not a Bearer token");
        };
        // Every token is compared whole, so the time taken does not tell how much matched.
        let matched = self.0.iter().fold(false, |matched, token| matched | constant_time_eq(token, presented));
        if matched { Ok(()) } else { Err("the bearer token is not accepted") }
    }
}

fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut difference = expected.len() ^ presented.len();
    for (index, byte) in expected.iter().enumerate() {
        difference |= usize::from(byte ^ presented.get(index).copied().unwrap_or(!byte));
    }
    difference == 0
}

/// google.rpc.Status, the OTLP/HTTP error body.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

const UNAUTHENTICATED: i32 = 16;

/// Guards the OTLP/HTTP receiver.
pub fn otlp_http(router: Router, config: &AuthConfig) -> Router {
    match Tokens::new(&config.ingest_tokens) {
        Some(tokens) => router.layer(axum::middleware::from_fn_with_state(tokens, otlp_http_guard)),
        None => router,
    }
}

async fn otlp_http_guard(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    match tokens.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(message) => otlp_http_refusal(request.headers(), StatusCode::UNAUTHORIZED, message),
    }
}

/// An OTLP/HTTP refusal: `status` (401 with `WWW-Authenticate`), a google.rpc.Status body
/// (UNAUTHENTICATED) in the request's encoding.
pub(crate) fn otlp_http_refusal(headers: &HeaderMap, status: StatusCode, message: &str) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.to_ascii_lowercase().starts_with("application/json"));
    let (content_type, body) = if json {
        (
            "application/json",
            serde_json::json!({ "code": UNAUTHENTICATED, "message": message }).to_string().into_bytes(),
        )
    } else {
        let rpc_status = RpcStatus { code: UNAUTHENTICATED, message: message.to_string() };
        ("application/x-protobuf", prost::Message::encode_to_vec(&rpc_status))
    };
    let mut response = (status, [(header::CONTENT_TYPE, content_type)], body).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"lagscope\""));
    }
    response
}

/// An API refusal: `status` with the API's JSON error body.
pub(crate) fn api_refusal(status: StatusCode, message: &str) -> Response {
    let mut response = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"lagscope\""));
    }
    response
}

/// Guards the OTLP/gRPC receiver.
pub fn otlp_grpc(router: Router, config: &AuthConfig) -> Router {
    match Tokens::new(&config.ingest_tokens) {
        Some(tokens) => router.layer(axum::middleware::from_fn_with_state(tokens, grpc_guard)),
        None => router,
    }
}

async fn grpc_guard(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    match tokens.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(message) => grpc_refusal(message),
    }
}

/// A gRPC refusal: UNAUTHENTICATED with `message`.
pub(crate) fn grpc_refusal(message: &str) -> Response {
    tonic::Status::unauthenticated(message.to_string()).into_http::<axum::body::Body>().into_response()
}

/// Guards the API and `/metrics` (not `GET /api/v1/health`).
pub fn api(router: Router, config: &AuthConfig) -> Router {
    match Tokens::new(&config.api_tokens) {
        Some(tokens) => router.layer(axum::middleware::from_fn_with_state(tokens, api_guard)),
        None => router,
    }
}

async fn api_guard(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    if request.uri().path() == "/api/v1/health" {
        return next.run(request).await;
    }
    match tokens.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(message) => api_refusal(StatusCode::UNAUTHORIZED, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_token_whole_is_accepted() {
        let tokens = Tokens::new(&["0123456789abcdef".to_string(), "fedcba9876543210xyz".to_string()]).expect("on");
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).expect("header"));
            headers
        };
        assert_eq!(tokens.check(&with("Bearer 0123456789abcdef")), Ok(()));
        assert_eq!(tokens.check(&with("Bearer fedcba9876543210xyz")), Ok(()));
        for refused in ["Bearer 0123456789abcde", "Bearer 0123456789abcdef0", "Bearer ", "Basic 0123456789abcdef"] {
            assert!(tokens.check(&with(refused)).is_err(), "{refused}");
        }
        assert!(tokens.check(&HeaderMap::new()).expect_err("refused").contains("missing Authorization"));
        assert!(Tokens::new(&[]).is_none(), "no tokens: open");
    }
}
