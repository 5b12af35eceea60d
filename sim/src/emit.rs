//! Turns what simulated processes do into OTLP export requests, batched per process the way
//! an SDK's batch exporter would, and hands them to a [`Sink`].

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};

use crate::Nanos;
use crate::rng::Rng;

/// One OTLP export request, as a process would send it.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Traces(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
    Logs(ExportLogsServiceRequest),
}

/// Where export requests go: a file, an OTLP endpoint, memory. `at` is the simulated time of
/// the export (for pacing in real time).
pub trait Sink {
    fn export(&mut self, at: Nanos, request: Request);
}

impl<T: Sink + ?Sized> Sink for &mut T {
    fn export(&mut self, at: Nanos, request: Request) {
        (**self).export(at, request);
    }
}

impl Sink for Vec<Request> {
    fn export(&mut self, _at: Nanos, request: Request) {
        self.push(request);
    }
}

/// Who a process is: its OTLP resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    pub service: String,
    pub system: String,
    pub cluster: String,
    pub component: &'static str,
    pub node_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(usize);

/// A span's identity, to parent other spans on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

/// OTLP span kinds used by the models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Client,
    Server,
    Internal,
}

/// A span to emit.
#[derive(Debug, Clone)]
pub struct SpanSpec {
    pub name: String,
    pub kind: Kind,
    pub start: Nanos,
    pub end: Nanos,
    /// `None` starts a new trace (when `traced`).
    pub parent: Option<SpanContext>,
    /// Whether the system propagates trace context at all; without it the span has no ids and
    /// is joined by call id.
    pub traced: bool,
    pub error: Option<String>,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<(Nanos, String, Vec<KeyValue>)>,
}

impl SpanSpec {
    pub fn new(name: impl Into<String>, kind: Kind, start: Nanos, end: Nanos) -> Self {
        Self {
            name: name.into(),
            kind,
            start,
            end,
            parent: None,
            traced: true,
            error: None,
            attributes: Vec::new(),
            events: Vec::new(),
        }
    }
}

pub fn string(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }),
        ..KeyValue::default()
    }
}

pub fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..KeyValue::default()
    }
}

pub fn boolean(key: &str, value: bool) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(any_value::Value::BoolValue(value)) }),
        ..KeyValue::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MetricShape {
    Gauge,
    Counter,
}

/// A point waiting for its flush: (name, shape) → points.
type PendingMetrics = BTreeMap<(String, MetricShape), Vec<NumberDataPoint>>;

/// Collects spans, metric points and log records per process and exports them in batches.
pub struct Emitter {
    start_unix_nano: i64,
    flush_interval: Nanos,
    next_flush: Nanos,
    ids: Rng,
    processes: Vec<ProcessSpec>,
    spans: BTreeMap<ProcessId, Vec<Span>>,
    metrics: BTreeMap<ProcessId, PendingMetrics>,
    logs: BTreeMap<ProcessId, Vec<LogRecord>>,
    pub spans_emitted: u64,
}

const SCOPE: &str = "lagscope-sim";

impl Emitter {
    pub fn new(start_unix_nano: i64, flush_interval: Nanos, ids: Rng) -> Self {
        Self {
            start_unix_nano,
            flush_interval,
            next_flush: flush_interval,
            ids,
            processes: Vec::new(),
            spans: BTreeMap::new(),
            metrics: BTreeMap::new(),
            logs: BTreeMap::new(),
            spans_emitted: 0,
        }
    }

    pub fn process(&mut self, spec: ProcessSpec) -> ProcessId {
        if let Some(index) = self.processes.iter().position(|known| *known == spec) {
            return ProcessId(index);
        }
        self.processes.push(spec);
        ProcessId(self.processes.len() - 1)
    }

    pub fn unix_nanos(&self, at: Nanos) -> i64 {
        self.start_unix_nano + at
    }

    /// Records a span (exported when the batch containing its end is flushed).
    pub fn span(&mut self, process: ProcessId, spec: SpanSpec) -> SpanContext {
        let context = match (spec.traced, spec.parent) {
            (false, _) => SpanContext { trace_id: [0; 16], span_id: [0; 8] },
            (true, Some(parent)) => SpanContext { trace_id: parent.trace_id, span_id: self.span_id() },
            (true, None) => SpanContext { trace_id: self.trace_id(), span_id: self.span_id() },
        };
        let traced = spec.traced;
        let span = Span {
            trace_id: if traced { context.trace_id.to_vec() } else { Vec::new() },
            span_id: if traced { context.span_id.to_vec() } else { Vec::new() },
            parent_span_id: match (traced, spec.parent) {
                (true, Some(parent)) => parent.span_id.to_vec(),
                _ => Vec::new(),
            },
            name: spec.name,
            kind: match spec.kind {
                Kind::Internal => span::SpanKind::Internal as i32,
                Kind::Server => span::SpanKind::Server as i32,
                Kind::Client => span::SpanKind::Client as i32,
            },
            start_time_unix_nano: self.unix_time(spec.start),
            end_time_unix_nano: self.unix_time(spec.end),
            attributes: spec.attributes,
            events: spec
                .events
                .into_iter()
                .map(|(at, name, attributes)| span::Event {
                    time_unix_nano: self.unix_time(at),
                    name,
                    attributes,
                    dropped_attributes_count: 0,
                })
                .collect(),
            status: spec.error.map(|message| Status { message, code: 2 }),
            ..Span::default()
        };
        self.spans.entry(process).or_default().push(span);
        self.spans_emitted += 1;
        context
    }

    pub fn gauge(&mut self, process: ProcessId, name: &str, at: Nanos, value: f64, attributes: Vec<KeyValue>) {
        self.point(process, name, MetricShape::Gauge, at, value, attributes);
    }

    /// A cumulative monotonic counter's running total.
    pub fn counter(&mut self, process: ProcessId, name: &str, at: Nanos, total: f64, attributes: Vec<KeyValue>) {
        self.point(process, name, MetricShape::Counter, at, total, attributes);
    }

    fn point(
        &mut self,
        process: ProcessId,
        name: &str,
        shape: MetricShape,
        at: Nanos,
        value: f64,
        attributes: Vec<KeyValue>,
    ) {
        let point = NumberDataPoint {
            attributes,
            start_time_unix_nano: if shape == MetricShape::Counter { self.unix_time(0) } else { 0 },
            time_unix_nano: self.unix_time(at),
            value: Some(if value.fract() == 0.0 && value.abs() < 9.0e15 {
                number_data_point::Value::AsInt(value as i64)
            } else {
                number_data_point::Value::AsDouble(value)
            }),
            ..NumberDataPoint::default()
        };
        self.metrics.entry(process).or_default().entry((name.to_string(), shape)).or_default().push(point);
    }

    pub fn log(
        &mut self,
        process: ProcessId,
        at: Nanos,
        severity: (i32, &str),
        body: String,
        attributes: Vec<KeyValue>,
    ) {
        let record = LogRecord {
            time_unix_nano: self.unix_time(at),
            observed_time_unix_nano: self.unix_time(at),
            severity_number: severity.0,
            severity_text: severity.1.to_string(),
            body: Some(AnyValue { value: Some(any_value::Value::StringValue(body)) }),
            attributes,
            ..LogRecord::default()
        };
        self.logs.entry(process).or_default().push(record);
    }

    /// Exports every batch whose flush time has come by `now`.
    pub fn advance(&mut self, now: Nanos, sink: &mut dyn Sink) {
        while self.next_flush <= now {
            let boundary = self.next_flush;
            self.flush(boundary, sink);
            self.next_flush += self.flush_interval;
        }
    }

    /// Exports everything still pending.
    pub fn finish(&mut self, sink: &mut dyn Sink) {
        self.flush(Nanos::MAX, sink);
    }

    fn flush(&mut self, boundary: Nanos, sink: &mut dyn Sink) {
        let at = boundary.min(self.next_flush);
        let cutoff = self.unix_time(boundary.min(Nanos::MAX / 2));
        let process_ids: Vec<ProcessId> = (0..self.processes.len()).map(ProcessId).collect();
        for process in &process_ids {
            let Some(pending) = self.spans.get_mut(process) else { continue };
            let (due, later): (Vec<Span>, Vec<Span>) =
                pending.drain(..).partition(|span| boundary == Nanos::MAX || span.end_time_unix_nano <= cutoff);
            *pending = later;
            if due.is_empty() {
                continue;
            }
            let request = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(self.resource(*process)),
                    scope_spans: vec![ScopeSpans { scope: Some(scope()), spans: due, schema_url: String::new() }],
                    schema_url: String::new(),
                }],
            };
            sink.export(at, Request::Traces(request));
        }
        for process in &process_ids {
            let Some(pending) = self.metrics.remove(process) else { continue };
            let metrics: Vec<Metric> =
                pending.into_iter().map(|((name, shape), points)| metric(name, shape, points)).collect();
            let request = ExportMetricsServiceRequest {
                resource_metrics: vec![ResourceMetrics {
                    resource: Some(self.resource(*process)),
                    scope_metrics: vec![ScopeMetrics { scope: Some(scope()), metrics, schema_url: String::new() }],
                    schema_url: String::new(),
                }],
            };
            sink.export(at, Request::Metrics(request));
        }
        for process in &process_ids {
            let Some(records) = self.logs.remove(process) else { continue };
            let request = ExportLogsServiceRequest {
                resource_logs: vec![ResourceLogs {
                    resource: Some(self.resource(*process)),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(scope()),
                        log_records: records,
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                }],
            };
            sink.export(at, Request::Logs(request));
        }
    }

    fn resource(&self, process: ProcessId) -> Resource {
        let spec = &self.processes[process.0];
        Resource {
            attributes: vec![
                string("service.name", spec.service.clone()),
                string("lagscope.system", spec.system.clone()),
                string("lagscope.cluster", spec.cluster.clone()),
                string("lagscope.component", spec.component),
                string("lagscope.node.id", spec.node_id.clone()),
                string("host.name", format!("{}.sim.lagscope", spec.node_id)),
            ],
            ..Resource::default()
        }
    }

    fn unix_time(&self, at: Nanos) -> u64 {
        (self.start_unix_nano + at).max(0) as u64
    }

    fn trace_id(&mut self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.ids.next_u64().to_be_bytes());
        id[8..].copy_from_slice(&(self.ids.next_u64() | 1).to_be_bytes());
        id
    }

    fn span_id(&mut self) -> [u8; 8] {
        (self.ids.next_u64() | 1).to_be_bytes()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        ..Default::default()
    }
}

fn metric(name: String, shape: MetricShape, data_points: Vec<NumberDataPoint>) -> Metric {
    let data = match shape {
        MetricShape::Gauge => metric::Data::Gauge(Gauge { data_points }),
        MetricShape::Counter => metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
    };
    Metric { name, data: Some(data), ..Metric::default() }
}

/// Prefixes the cluster (resource) and the client ids (span and metric point attributes) with
/// `prefix` and a dot.
pub(crate) fn prefix_names(request: &mut Request, prefix: &str) {
    let resources: Vec<&mut Vec<KeyValue>> = match request {
        Request::Traces(request) => request
            .resource_spans
            .iter_mut()
            .filter_map(|item| item.resource.as_mut())
            .map(|resource| &mut resource.attributes)
            .collect(),
        Request::Metrics(request) => request
            .resource_metrics
            .iter_mut()
            .filter_map(|item| item.resource.as_mut())
            .map(|resource| &mut resource.attributes)
            .collect(),
        Request::Logs(request) => request
            .resource_logs
            .iter_mut()
            .filter_map(|item| item.resource.as_mut())
            .map(|resource| &mut resource.attributes)
            .collect(),
    };
    for attributes in resources {
        prefix_value(attributes, "lagscope.cluster", prefix);
    }
    match request {
        Request::Traces(request) => {
            for span in request
                .resource_spans
                .iter_mut()
                .flat_map(|item| &mut item.scope_spans)
                .flat_map(|scope| &mut scope.spans)
            {
                prefix_value(&mut span.attributes, "lagscope.client.id", prefix);
            }
        }
        Request::Metrics(request) => {
            use opentelemetry_proto::tonic::metrics::v1::metric::Data;
            for metric in request
                .resource_metrics
                .iter_mut()
                .flat_map(|item| &mut item.scope_metrics)
                .flat_map(|scope| &mut scope.metrics)
            {
                let points: Vec<&mut Vec<KeyValue>> = match &mut metric.data {
                    Some(Data::Gauge(gauge)) => {
                        gauge.data_points.iter_mut().map(|point| &mut point.attributes).collect()
                    }
                    Some(Data::Sum(sum)) => sum.data_points.iter_mut().map(|point| &mut point.attributes).collect(),
                    _ => Vec::new(),
                };
                for attributes in points {
                    prefix_value(attributes, "lagscope.client.id", prefix);
                }
            }
        }
        Request::Logs(_) => {}
    }
}

fn prefix_value(attributes: &mut [KeyValue], key: &str, prefix: &str) {
    for attribute in attributes.iter_mut().filter(|attribute| attribute.key == key) {
        if let Some(AnyValue { value: Some(any_value::Value::StringValue(text)) }) = &mut attribute.value {
            *text = format!("{prefix}.{text}");
        }
    }
}
