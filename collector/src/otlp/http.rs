//! The OTLP/HTTP receiver: `POST /v1/traces`, `/v1/metrics` and `/v1/logs`, protobuf or JSON,
//! optionally gzip- or zstd-compressed. A 200 means every accepted record is committed to the store.

use std::future::Future;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::BytesMut;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::json;

use super::decode::{Encoding, decode_message, decompress};
use super::ingest::{Accepted, Ingestor, StoreUnavailable};
use crate::DecodeError;
use crate::queue::{DECODED_BYTES_FACTOR, QueueFull, RETRY_AFTER_SECONDS, Reservation};

/// Default bound on a request body after decompression (the OTLP/HTTP size limit).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// What the receiver needs: the ingest path and its size limit.
#[derive(Clone)]
pub struct ReceiverState {
    pub ingestor: Ingestor,
    pub max_body_bytes: usize,
}

/// The OTLP/HTTP routes, ready to merge into a server's router.
pub fn router(state: ReceiverState) -> Router {
    Router::new()
        .route("/v1/traces", post(handle::<ExportTraceServiceRequest>))
        .route("/v1/metrics", post(handle::<ExportMetricsServiceRequest>))
        .route("/v1/logs", post(handle::<ExportLogsServiceRequest>))
        // The receiver reads the body itself to enforce its own limit with an OTLP answer.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// What differs between the three OTLP signals on HTTP.
trait Signal: Message + Default + serde::de::DeserializeOwned + Send + Sync + 'static {
    const NAME: &'static str;
    /// The partial-success field counting rejected records, in OTLP/JSON.
    const REJECTED_FIELD: &'static str;
    fn ingest(
        ingestor: &Ingestor,
        request: &Self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Accepted, StoreUnavailable>> + Send;
    fn protobuf_response(accepted: &Accepted) -> Vec<u8>;
}

impl Signal for ExportTraceServiceRequest {
    const NAME: &'static str = "traces";
    const REJECTED_FIELD: &'static str = "rejectedSpans";
    fn ingest(
        ingestor: &Ingestor,
        request: &Self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Accepted, StoreUnavailable>> + Send {
        ingestor.traces(request, reservation)
    }
    fn protobuf_response(accepted: &Accepted) -> Vec<u8> {
        let partial_success = (accepted.rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: accepted.rejected,
            error_message: accepted.message.clone(),
        });
        ExportTraceServiceResponse { partial_success }.encode_to_vec()
    }
}

impl Signal for ExportMetricsServiceRequest {
    const NAME: &'static str = "metrics";
    const REJECTED_FIELD: &'static str = "rejectedDataPoints";
    fn ingest(
        ingestor: &Ingestor,
        request: &Self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Accepted, StoreUnavailable>> + Send {
        ingestor.metrics(request, reservation)
    }
    fn protobuf_response(accepted: &Accepted) -> Vec<u8> {
        let partial_success = (accepted.rejected > 0).then(|| ExportMetricsPartialSuccess {
            rejected_data_points: accepted.rejected,
            error_message: accepted.message.clone(),
        });
        ExportMetricsServiceResponse { partial_success }.encode_to_vec()
    }
}

impl Signal for ExportLogsServiceRequest {
    const NAME: &'static str = "logs";
    const REJECTED_FIELD: &'static str = "rejectedLogRecords";
    fn ingest(
        ingestor: &Ingestor,
        request: &Self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Accepted, StoreUnavailable>> + Send {
        ingestor.logs(request, reservation)
    }
    fn protobuf_response(accepted: &Accepted) -> Vec<u8> {
        let partial_success = (accepted.rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: accepted.rejected,
            error_message: accepted.message.clone(),
        });
        ExportLogsServiceResponse { partial_success }.encode_to_vec()
    }
}

async fn handle<S: Signal>(State(state): State<ReceiverState>, headers: HeaderMap, body: Body) -> Response {
    let response = match receive::<S>(&state, &headers, body).await {
        Err(failure) => failure.into_response(),
        Ok((request, encoding, reservation)) => match S::ingest(&state.ingestor, &request, reservation).await {
            Err(StoreUnavailable) => Failure::unavailable().into_response(),
            Ok(accepted) => {
                success(encoding, S::protobuf_response(&accepted), partial_json(S::REJECTED_FIELD, &accepted))
            }
        },
    };
    state.ingestor.metrics.count_response(S::NAME, response.status().as_u16());
    response
}

/// Reads, bounds, decompresses and decodes a request body, reserving room for it in the
/// ingest queue as it goes (so a full queue refuses the request before it takes memory).
async fn receive<R>(
    state: &ReceiverState,
    headers: &HeaderMap,
    mut body: Body,
) -> Result<(R, Encoding, Reservation), Failure>
where
    R: Message + Default + serde::de::DeserializeOwned,
{
    let content_type = header_text(headers, header::CONTENT_TYPE);
    let encoding = Encoding::from_content_type(content_type).map_err(|error| Failure::decode(error, Encoding::Json))?;
    let content_encoding = header_text(headers, header::CONTENT_ENCODING);
    let queue = &state.ingestor.queue;
    let full = |refused: QueueFull| Failure::queue_full(refused, encoding);
    // A refusal made before the body is read whole reads (and discards) the rest first: a
    // sender still writing its body would otherwise see the connection cut instead of the
    // answer telling it to retry.
    async fn refuse_after_draining(mut body: Body, mut read: usize, limit: usize, failure: Failure) -> Failure {
        while read <= limit {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) | None => break,
            }
        }
        failure
    }
    let too_large = || Failure::decode(DecodeError::TooLarge { limit: state.max_body_bytes }, encoding);
    let identity = matches!(
        content_encoding.map(|text| text.trim().to_ascii_lowercase()).as_deref(),
        None | Some("" | "identity")
    );
    let declared = header_text(headers, header::CONTENT_LENGTH).and_then(|length| length.parse::<usize>().ok());
    if declared.is_some_and(|length| length > state.max_body_bytes) {
        return Err(too_large());
    }
    // With a declared length the whole room is taken at once, all or nothing: many senders
    // each holding part of the queue while they read would starve one another.
    let mut reservation = match queue.reserve(declared.unwrap_or(0).saturating_mul(1 + DECODED_BYTES_FACTOR)) {
        Ok(reservation) => reservation,
        Err(refused) => return Err(refuse_after_draining(body, 0, state.max_body_bytes, full(refused)).await),
    };
    let mut wire = BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| {
            Failure::new(StatusCode::BAD_REQUEST, format!("cannot read the request body: {error}"), encoding)
        })?;
        if let Ok(data) = frame.into_data() {
            if wire.len() + data.len() > state.max_body_bytes {
                return Err(too_large());
            }
            // Without a declared length, room is taken as the body arrives.
            let read = wire.len() + data.len();
            if let Err(refused) = reservation.resize(read.max(reservation.bytes())) {
                drop((wire, reservation));
                return Err(refuse_after_draining(body, read, state.max_body_bytes, full(refused)).await);
            }
            wire.extend_from_slice(&data);
        }
    }
    let wire = wire.freeze();
    let bytes = if identity {
        wire
    } else {
        Bytes::from(
            decompress(&wire, content_encoding, state.max_body_bytes)
                .map_err(|error| Failure::decode(error, encoding))?,
        )
    };
    // The room the decoded request needs: its bytes and what decoding makes of them.
    reservation.resize(bytes.len().saturating_mul(1 + DECODED_BYTES_FACTOR)).map_err(full)?;
    let request = decode_message::<R>(&bytes, encoding).map_err(|error| Failure::decode(error, encoding))?;
    Ok((request, encoding, reservation))
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

fn partial_json(field: &str, accepted: &Accepted) -> serde_json::Value {
    if accepted.rejected == 0 {
        return json!({});
    }
    json!({ "partialSuccess": { field: accepted.rejected.to_string(), "errorMessage": accepted.message } })
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

    /// Nothing was committed and the condition may pass: the sender should retry.
    fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the store cannot commit data right now; retry later".to_string(),
            encoding: Encoding::Json,
            retry_after: Some(5),
        }
    }

    /// The ingest queue is full: retryable (429) after the hinted delay.
    fn queue_full(refused: QueueFull, encoding: Encoding) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: refused.to_string(),
            encoding,
            retry_after: Some(RETRY_AFTER_SECONDS),
        }
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
        // gRPC codes: INVALID_ARGUMENT for bad data, RESOURCE_EXHAUSTED when the queue is
        // full, UNAVAILABLE when the store cannot commit.
        let code = match self.status {
            StatusCode::SERVICE_UNAVAILABLE => 14,
            StatusCode::TOO_MANY_REQUESTS => 8,
            _ => 3,
        };
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
