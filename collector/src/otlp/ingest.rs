//! The one ingest path every receiver (OTLP/HTTP, OTLP/gRPC) goes through: convert, count,
//! and commit through the ingest queue (which tells the live analyzer).

use std::sync::Arc;

use lagscope_selfmetrics::{Counter, SelfMetrics};
use lagscope_store::IngestBatch;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::{Converted, logs_from_request, samples_from_request, spans_from_request};
pub use crate::queue::StoreUnavailable;
use crate::queue::{IngestQueue, Reservation};

/// Converts what receivers decoded and commits it.
#[derive(Clone)]
pub struct Ingestor {
    pub queue: IngestQueue,
    pub metrics: Arc<SelfMetrics>,
}

/// A request's records are committed, except `rejected` ones (OTLP partial success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub rejected: i64,
    pub message: String,
}

impl Ingestor {
    pub async fn traces(
        &self,
        request: &ExportTraceServiceRequest,
        reservation: Reservation,
    ) -> Result<Accepted, StoreUnavailable> {
        let converted = spans_from_request(request);
        count(&converted, &self.metrics.spans_received, &self.metrics.spans_rejected);
        let (accepted, spans) = split(converted);
        self.queue.commit(IngestBatch { spans, ..IngestBatch::default() }, reservation).await?;
        Ok(accepted)
    }

    pub async fn metrics(
        &self,
        request: &ExportMetricsServiceRequest,
        reservation: Reservation,
    ) -> Result<Accepted, StoreUnavailable> {
        let converted = samples_from_request(request);
        count(&converted, &self.metrics.samples_received, &self.metrics.samples_rejected);
        let (accepted, samples) = split(converted);
        self.queue.commit(IngestBatch { samples, ..IngestBatch::default() }, reservation).await?;
        Ok(accepted)
    }

    pub async fn logs(
        &self,
        request: &ExportLogsServiceRequest,
        reservation: Reservation,
    ) -> Result<Accepted, StoreUnavailable> {
        let converted = logs_from_request(request);
        count(&converted, &self.metrics.logs_received, &self.metrics.logs_rejected);
        let (accepted, logs) = split(converted);
        self.queue.commit(IngestBatch { logs, ..IngestBatch::default() }, reservation).await?;
        Ok(accepted)
    }
}

fn count<T>(converted: &Converted<T>, received: &Counter, rejected: &Counter) {
    received.add((converted.items.len() + converted.rejections.len()) as u64);
    rejected.add(converted.rejections.len() as u64);
}

fn split<T>(converted: Converted<T>) -> (Accepted, Vec<T>) {
    let accepted = Accepted {
        rejected: converted.rejections.len() as i64,
        message: converted.rejection_message().unwrap_or_default(),
    };
    (accepted, converted.items)
}
