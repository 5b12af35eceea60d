//! The one ingest path every receiver (OTLP/HTTP, OTLP/gRPC) goes through: convert, commit,
//! count, and tell the live analyzer.

use std::sync::Arc;
use std::time::Instant;

use lagscope_selfmetrics::{Counter, SelfMetrics};
use lagscope_store::{IngestBatch, Store};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::{Converted, logs_from_request, samples_from_request, spans_from_request};
use crate::DirtyClients;

/// Commits what receivers decoded.
#[derive(Clone)]
pub struct Ingestor {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<SelfMetrics>,
    pub dirty: Arc<DirtyClients>,
}

/// A request's records are committed, except `rejected` ones (OTLP partial success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub rejected: i64,
    pub message: String,
}

/// The store could not commit: nothing of the request was written; the sender may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUnavailable;

impl Ingestor {
    pub async fn traces(&self, request: &ExportTraceServiceRequest) -> Result<Accepted, StoreUnavailable> {
        let converted = spans_from_request(request);
        count(&converted, &self.metrics.spans_received, &self.metrics.spans_rejected);
        let (accepted, spans) = split(converted);
        let batch = IngestBatch { spans, ..IngestBatch::default() };
        self.commit(&batch).await?;
        self.dirty.mark(&batch.spans);
        self.metrics.batches_marked.add(1);
        Ok(accepted)
    }

    pub async fn metrics(&self, request: &ExportMetricsServiceRequest) -> Result<Accepted, StoreUnavailable> {
        let converted = samples_from_request(request);
        count(&converted, &self.metrics.samples_received, &self.metrics.samples_rejected);
        let (accepted, samples) = split(converted);
        let batch = IngestBatch { samples, ..IngestBatch::default() };
        self.commit(&batch).await?;
        self.dirty.mark_batch(&[], &batch.samples);
        self.metrics.batches_marked.add(1);
        Ok(accepted)
    }

    pub async fn logs(&self, request: &ExportLogsServiceRequest) -> Result<Accepted, StoreUnavailable> {
        let converted = logs_from_request(request);
        count(&converted, &self.metrics.logs_received, &self.metrics.logs_rejected);
        let (accepted, logs) = split(converted);
        self.commit(&IngestBatch { logs, ..IngestBatch::default() }).await?;
        Ok(accepted)
    }

    async fn commit(&self, batch: &IngestBatch) -> Result<(), StoreUnavailable> {
        let started = Instant::now();
        match self.store.ingest(batch).await {
            Ok(receipt) => {
                self.metrics.store_ingest_latency.observe(started.elapsed());
                self.metrics.spans_stored.add(receipt.spans_written);
                self.metrics.samples_stored.add(receipt.samples_written);
                self.metrics.logs_stored.add(receipt.logs_written);
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, "store refused an ingest batch");
                Err(StoreUnavailable)
            }
        }
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
