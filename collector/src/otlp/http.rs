//! The OTLP/HTTP receiver: `POST /v1/traces` and `POST /v1/metrics`, protobuf or JSON,
//! optionally gzipped. A 200 means every accepted record is committed to the store.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{IngestBatch, Store};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::json;

use super::decode::{Encoding, decode_message, decompress};
use super::{samples_from_request, spans_from_request};
use crate::{DecodeError, DirtyClients};

/// Default bound on a request body after decompression (the OTLP/HTTP size limit).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// What the receiver needs: where to commit, what to count, whom to tell.
#[derive(Clone)]
pub struct ReceiverState {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<SelfMetrics>,
    pub dirty: Arc<DirtyClients>,
    pub max_body_bytes: usize,
}

/// The OTLP/HTTP routes, ready to merge into a server's router.
pub fn router(state: ReceiverState) -> Router {
    Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        // The receiver reads the body itself to enforce its own limit with an OTLP answer.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn traces(State(state): State<ReceiverState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = receive::<ExportTraceServiceRequest>(&state, &headers, body).await;
    let response = match outcome {
        Err(failure) => failure.into_response(),
        Ok((request, encoding)) => {
            let converted = spans_from_request(&request);
            state.metrics.spans_received.add((converted.items.len() + converted.rejections.len()) as u64);
            state.metrics.spans_rejected.add(converted.rejections.len() as u64);
            let rejected = converted.rejections.len() as i64;
            let message = converted.rejection_message().unwrap_or_default();
            let batch = IngestBatch { spans: converted.items, samples: Vec::new() };
            match commit(&state, batch).await {
                Err(failure) => failure.into_response(),
                Ok(batch) => {
                    state.dirty.mark(&batch.spans);
                    state.metrics.batches_marked.add(1);
                    let partial = (rejected > 0).then(|| ExportTracePartialSuccess {
                        rejected_spans: rejected,
                        error_message: message.clone(),
                    });
                    success(
                        encoding,
                        ExportTraceServiceResponse { partial_success: partial }.encode_to_vec(),
                        partial_json("rejectedSpans", rejected, &message),
                    )
                }
            }
        }
    };
    state.metrics.count_response("traces", response.status().as_u16());
    response
}

async fn metrics(State(state): State<ReceiverState>, headers: HeaderMap, body: Body) -> Response {
    let outcome = receive::<ExportMetricsServiceRequest>(&state, &headers, body).await;
    let response = match outcome {
        Err(failure) => failure.into_response(),
        Ok((request, encoding)) => {
            let converted = samples_from_request(&request);
            state.metrics.samples_received.add((converted.items.len() + converted.rejections.len()) as u64);
            state.metrics.samples_rejected.add(converted.rejections.len() as u64);
            let rejected = converted.rejections.len() as i64;
            let message = converted.rejection_message().unwrap_or_default();
            let batch = IngestBatch { spans: Vec::new(), samples: converted.items };
            match commit(&state, batch).await {
                Err(failure) => failure.into_response(),
                Ok(_) => {
                    let partial = (rejected > 0).then(|| ExportMetricsPartialSuccess {
                        rejected_data_points: rejected,
                        error_message: message.clone(),
                    });
                    success(
                        encoding,
                        ExportMetricsServiceResponse { partial_success: partial }.encode_to_vec(),
                        partial_json("rejectedDataPoints", rejected, &message),
                    )
                }
            }
        }
    };
    state.metrics.count_response("metrics", response.status().as_u16());
    response
}

/// Reads, bounds, decompresses and decodes a request body.
async fn receive<R>(state: &ReceiverState, headers: &HeaderMap, body: Body) -> Result<(R, Encoding), Failure>
where
    R: Message + Default + serde::de::DeserializeOwned,
{
    let content_type = header_text(headers, header::CONTENT_TYPE);
    let encoding = Encoding::from_content_type(content_type).map_err(|error| Failure::decode(error, Encoding::Json))?;
    let body: Bytes = axum::body::to_bytes(body, state.max_body_bytes).await.map_err(|error| {
        let message = error.to_string();
        if is_length_limit(error.into_inner()) {
            Failure::decode(DecodeError::TooLarge { limit: state.max_body_bytes }, encoding)
        } else {
            Failure::new(StatusCode::BAD_REQUEST, format!("cannot read the request body: {message}"), encoding)
        }
    })?;
    let content_encoding = header_text(headers, header::CONTENT_ENCODING);
    let bytes =
        decompress(&body, content_encoding, state.max_body_bytes).map_err(|error| Failure::decode(error, encoding))?;
    let request = decode_message::<R>(&bytes, encoding).map_err(|error| Failure::decode(error, encoding))?;
    Ok((request, encoding))
}

/// Commits a batch, timing the store. Returns the batch back for the caller's bookkeeping.
async fn commit(state: &ReceiverState, batch: IngestBatch) -> Result<IngestBatch, Failure> {
    let started = Instant::now();
    match state.store.ingest(&batch).await {
        Ok(receipt) => {
            state.metrics.store_ingest_latency.observe(started.elapsed());
            state.metrics.spans_stored.add(receipt.spans_written);
            state.metrics.samples_stored.add(receipt.samples_written);
            Ok(batch)
        }
        Err(error) => {
            tracing::error!(%error, "store refused an ingest batch");
            // Nothing was committed and the condition may pass: the sender should retry.
            Err(Failure {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the store cannot commit data right now; retry later".to_string(),
                encoding: Encoding::Json,
                retry_after: Some(5),
            })
        }
    }
}

fn is_length_limit(error: Box<dyn std::error::Error + Send + Sync>) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error.as_ref());
    while let Some(cause) = current {
        if cause.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        current = cause.source();
    }
    false
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

fn partial_json(field: &str, rejected: i64, message: &str) -> serde_json::Value {
    if rejected == 0 {
        return json!({});
    }
    json!({ "partialSuccess": { field: rejected.to_string(), "errorMessage": message } })
}

fn success(encoding: Encoding, protobuf: Vec<u8>, json_body: serde_json::Value) -> Response {
    let body = match encoding {
        Encoding::Protobuf => protobuf,
        Encoding::Json => json_body.to_string().into_bytes(),
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, encoding.content_type())], body).into_response()
}

/// google.rpc.Status, the body of OTLP/HTTP error responses.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// A refused request: its status, a message naming what was wrong, and the encoding to
/// answer in.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    message: String,
    encoding: Encoding,
    retry_after: Option<u32>,
}

impl Failure {
    fn new(status: StatusCode, message: String, encoding: Encoding) -> Self {
        Self { status, message, encoding, retry_after: None }
    }

    fn decode(error: DecodeError, encoding: Encoding) -> Self {
        let status = match error {
            // RFC 9110 15.5.16: 415 covers an unsupported Content-Type or Content-Encoding.
            DecodeError::UnsupportedContentType(_) | DecodeError::UnsupportedContentEncoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            DecodeError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, error.to_string(), encoding)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        // gRPC codes: INVALID_ARGUMENT for bad data, UNAVAILABLE when the sender should retry.
        let code = if self.status == StatusCode::SERVICE_UNAVAILABLE { 14 } else { 3 };
        let body = match self.encoding {
            Encoding::Protobuf => RpcStatus { code, message: self.message }.encode_to_vec(),
            Encoding::Json => json!({ "code": code, "message": self.message }).to_string().into_bytes(),
        };
        let mut response = (self.status, [(header::CONTENT_TYPE, self.encoding.content_type())], body).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
