//! The OTLP/gRPC receiver: TraceService, MetricsService and LogsService over one ingest path
//! with OTLP/HTTP. OK means committed; rejected records come back as partial success.

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use prost::Message;

use super::ingest::{Accepted, Ingestor, StoreUnavailable};
use crate::queue::{DECODED_BYTES_FACTOR, RETRY_AFTER_SECONDS, Reservation};

/// The three OTLP services, ready for `tonic::transport::Server::add_service` or
/// `tonic::service::Routes`. `max_message_bytes` bounds a decoded request.
pub fn services(
    ingestor: Ingestor,
    max_message_bytes: usize,
) -> (TraceServiceServer<Receiver>, MetricsServiceServer<Receiver>, LogsServiceServer<Receiver>) {
    let receiver = Receiver { ingestor };
    (
        TraceServiceServer::new(receiver.clone())
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(max_message_bytes),
        MetricsServiceServer::new(receiver.clone())
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(max_message_bytes),
        LogsServiceServer::new(receiver)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(max_message_bytes),
    )
}

#[derive(Clone)]
pub struct Receiver {
    ingestor: Ingestor,
}

/// UNAVAILABLE is retryable in OTLP/gRPC: nothing was committed.
fn unavailable(_: StoreUnavailable) -> Status {
    Status::unavailable("the store cannot commit data right now; retry later")
}

/// google.rpc.RetryInfo: with it, RESOURCE_EXHAUSTED is retryable in OTLP/gRPC.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// google.protobuf.Duration.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// google.protobuf.Any.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// google.rpc.Status, carried in `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

/// RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo` of [`RETRY_AFTER_SECONDS`]: the OTLP/gRPC
/// way of saying "overloaded, retry later" (without RetryInfo the sender must not retry).
pub fn retryable_exhausted(message: String) -> Status {
    let retry = RetryInfo { retry_delay: Some(ProtoDuration { seconds: i64::from(RETRY_AFTER_SECONDS), nanos: 0 }) };
    let details = RpcStatus {
        code: tonic::Code::ResourceExhausted as i32,
        message: message.clone(),
        details: vec![ProtoAny {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".to_string(),
            value: retry.encode_to_vec(),
        }],
    };
    Status::with_details(tonic::Code::ResourceExhausted, message, details.encode_to_vec().into())
}

/// How long a refused export asks its sender to wait: the `google.rpc.RetryInfo` in the
/// status's details, as [`retryable_exhausted`] sends it (none: the status carries no
/// RetryInfo, and RESOURCE_EXHAUSTED without one must not be retried).
pub fn retry_delay(status: &Status) -> Option<std::time::Duration> {
    let details = RpcStatus::decode(status.details()).ok()?;
    let info = details.details.iter().find(|any| any.type_url == "type.googleapis.com/google.rpc.RetryInfo")?;
    let delay = RetryInfo::decode(info.value.as_slice()).ok()?.retry_delay?;
    Some(std::time::Duration::new(u64::try_from(delay.seconds).ok()?, u32::try_from(delay.nanos).ok()?))
}

/// Room in the ingest queue for a decoded request: its encoded size times the decoding factor.
fn reserve(ingestor: &Ingestor, request: &impl Message) -> Result<Reservation, Status> {
    ingestor
        .queue
        .reserve(request.encoded_len().saturating_mul(DECODED_BYTES_FACTOR))
        .map_err(|refused| retryable_exhausted(refused.to_string()))
}

fn respond<T>(
    signal: &'static str,
    metrics: &lagscope_selfmetrics::SelfMetrics,
    result: Result<T, Status>,
) -> Result<Response<T>, Status> {
    // gRPC answers are counted with the HTTP status their code maps to.
    let status = match &result {
        Ok(_) => 200,
        Err(status) if status.code() == tonic::Code::Unavailable => 503,
        Err(status) if status.code() == tonic::Code::ResourceExhausted => 429,
        Err(_) => 400,
    };
    metrics.count_response(signal, status);
    result.map(Response::new)
}

fn partial(accepted: &Accepted) -> Option<(i64, String)> {
    (accepted.rejected > 0).then(|| (accepted.rejected, accepted.message.clone()))
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let result = match reserve(&self.ingestor, request.get_ref()) {
            Err(status) => Err(status),
            Ok(reservation) => self.ingestor.traces(request.get_ref(), reservation).await.map_err(unavailable),
        };
        let result = result.map(|accepted| ExportTraceServiceResponse {
            partial_success: partial(&accepted)
                .map(|(rejected_spans, error_message)| ExportTracePartialSuccess { rejected_spans, error_message }),
        });
        respond("traces", &self.ingestor.metrics, result)
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let result = match reserve(&self.ingestor, request.get_ref()) {
            Err(status) => Err(status),
            Ok(reservation) => self.ingestor.metrics(request.get_ref(), reservation).await.map_err(unavailable),
        };
        let result = result.map(|accepted| ExportMetricsServiceResponse {
            partial_success: partial(&accepted).map(|(rejected_data_points, error_message)| {
                ExportMetricsPartialSuccess { rejected_data_points, error_message }
            }),
        });
        respond("metrics", &self.ingestor.metrics, result)
    }
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let result = match reserve(&self.ingestor, request.get_ref()) {
            Err(status) => Err(status),
            Ok(reservation) => self.ingestor.logs(request.get_ref(), reservation).await.map_err(unavailable),
        };
        let result = result.map(|accepted| ExportLogsServiceResponse {
            partial_success: partial(&accepted).map(|(rejected_log_records, error_message)| ExportLogsPartialSuccess {
                rejected_log_records,
                error_message,
            }),
        });
        respond("logs", &self.ingestor.metrics, result)
    }
}
