//! lagscope's domain model: the vocabulary every other crate speaks.
//!
//! Spans (one per attempt, with the telemetry conventions' fields promoted), metric samples
//! with their series labels, log records, anomalies with their evidence, and per-client causal timelines.
//! The attribute names of the public telemetry contract live in [`conventions`].
//!
//! This crate is pure data: it must never do I/O, spawn tasks or depend on tokio, sqlx, axum
//! or tonic. Everything else in the workspace depends on it, never the other way round.

pub mod anomaly;
pub mod conventions;
pub mod evidence;
pub mod json;
pub mod lag;
pub mod log;
pub mod metric;
pub mod rollup;
pub mod span;
pub mod timeline;

pub use anomaly::{Anomaly, AnomalyKind, Guarantee, Severity};
pub use evidence::Evidence;
pub use lag::{ApplyLagBucket, LagQuery, LagReport, Percentiles, ReadStalenessBucket, RejectionBucket};
pub use log::LogRecord;
pub use metric::{ExponentialBuckets, HistogramPoint, MetricKind, PointValue, Sample, SeriesKey, SeriesMeta};
pub use rollup::{LogHistogram, ROLLUP_STEP, ReadRollup, rollup_step_of};
pub use span::{
    Attributes, CallFields, Component, Op, Outcome, ResourceFields, Span, SpanEvent, SpanKind, SpanLink, SpanRef,
    StateFields,
};
pub use timeline::{ClientTimeline, ReportedState, TimelineAttempt, TimelineCall, TimelineJoin};

/// Nanoseconds since the Unix epoch, as OTLP counts time. Signed so that it maps onto SQL
/// `INTEGER`/`BIGINT` without conversion; OTLP times fit until the year 2262.
pub type UnixNanos = i64;

/// A state identifier (HDFS txid, Raft index, sequence number). Larger is newer, per namespace.
pub type StateId = i64;
