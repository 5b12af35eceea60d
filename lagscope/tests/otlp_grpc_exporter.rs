//! Spans, metrics and logs through the Rust OpenTelemetry SDK's OTLP/gRPC exporters (tonic,
//! gzip and zstd), into the OTLP/gRPC receiver: everything arrives, attributes intact; a record that
//! breaks the conventions comes back as partial success.

mod support;

use std::time::Duration;

use lagscope_store::{SqliteStore, Store, TimeRange};
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{SpanKind, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_otlp::{Compression, LogExporter, MetricExporter, SpanExporter, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use support::start_server;

fn resource() -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "ozone-client"),
            KeyValue::new("lagscope.system", "ozone"),
            KeyValue::new("lagscope.cluster", "ozone-west"),
            KeyValue::new("lagscope.component", "client"),
            KeyValue::new("deployment.environment", "staging"),
        ])
        .build()
}

/// Exports through all three gRPC exporters and shuts them down (which flushes).
fn export_everything(endpoint: String) {
    // Half the spans gzipped, half zstd-compressed (the Collector's exporters' other choice).
    for (compression, indexes) in [(Compression::Gzip, 0..13i64), (Compression::Zstd, 13..25)] {
        let spans = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_compression(compression)
            .build()
            .expect("span exporter");
        let tracer_provider = SdkTracerProvider::builder().with_resource(resource()).with_batch_exporter(spans).build();
        let tracer = tracer_provider.tracer("ozone-client");
        for index in indexes {
            let span = tracer
                .span_builder("lookupKey")
                .with_kind(SpanKind::Client)
                .with_attributes([
                    KeyValue::new("lagscope.client.id", "grpc-client-1"),
                    KeyValue::new("lagscope.namespace", "om-service-1"),
                    KeyValue::new("lagscope.op", "read"),
                    KeyValue::new("lagscope.state.carried", 1000 + index),
                    KeyValue::new("custom.flag", index % 2 == 0),
                    KeyValue::new("custom.ratio", 0.25),
                    KeyValue::new("custom.tags", Value::Array(Array::String(vec!["a".into(), "b".into()]))),
                ])
                .start(&tracer);
            drop(span);
        }
        tracer_provider.shutdown().expect("spans flushed");
    }

    let metrics = MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .with_compression(Compression::Gzip)
        .build()
        .expect("metric exporter");
    let reader = PeriodicReader::builder(metrics).with_interval(Duration::from_secs(3600)).build();
    let meter_provider = SdkMeterProvider::builder().with_resource(resource()).with_reader(reader).build();
    let meter = meter_provider.meter("ozone-om");
    let requeues = meter.u64_counter("om.requeues").build();
    requeues.add(7, &[KeyValue::new("lagscope.node.id", "om-2"), KeyValue::new("custom.reason", "lagging")]);
    let applied = meter.i64_gauge("lagscope.node.applied_state").build();
    applied.record(
        123_456,
        &[KeyValue::new("lagscope.node.id", "om-2"), KeyValue::new("lagscope.namespace", "om-service-1")],
    );
    meter_provider.shutdown().expect("metrics flushed");

    let logs = LogExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_compression(Compression::Gzip)
        .build()
        .expect("log exporter");
    let logger_provider = SdkLoggerProvider::builder().with_resource(resource()).with_batch_exporter(logs).build();
    let logger = logger_provider.logger("ozone-client");
    let mut record = logger.create_log_record();
    record.set_severity_number(Severity::Warn);
    record.set_severity_text("WARN");
    record.set_body(AnyValue::String("Disable OM follower read and retry OM leader directly".into()));
    record.add_attribute("lagscope.client.id", "grpc-client-1");
    record.add_attribute("custom.attempt", 3i64);
    logger.emit(record);
    logger_provider.shutdown().expect("logs flushed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_grpc_exporters_deliver_spans_metrics_and_logs_intact() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let endpoint = format!("http://{}", server.otlp_grpc_addr);
    // The SDK's exporters block in shutdown; they run on their own thread with a runtime.
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
        runtime.block_on(async { tokio::task::spawn_blocking(move || export_everything(endpoint)).await })
    })
    .await
    .expect("exporter thread")
    .expect("exporters");
    server.shutdown().await.expect("clean shutdown");

    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    let spans = store.client_spans("grpc-client-1", TimeRange::ALL, 100).await.expect("spans");
    assert_eq!(spans.len(), 25, "every span arrived");
    let mut carried: Vec<i64> = spans.iter().filter_map(|span| span.call.state.carried).collect();
    carried.sort_unstable();
    assert_eq!(carried, (1000..1025).collect::<Vec<_>>());
    let span = &spans[0];
    assert_eq!(span.name, "lookupKey");
    assert_eq!(span.resource.cluster.as_deref(), Some("ozone-west"));
    assert_eq!(span.call.namespace.as_deref(), Some("om-service-1"));
    assert_eq!(span.resource.attributes.get("deployment.environment"), Some(&serde_json::json!("staging")));
    assert_eq!(span.attributes.get("custom.ratio"), Some(&serde_json::json!(0.25)));
    assert_eq!(span.attributes.get("custom.tags"), Some(&serde_json::json!(["a", "b"])));
    assert!(span.attributes.get("custom.flag").is_some_and(serde_json::Value::is_boolean), "{:?}", span.attributes);

    let requeues = store.series_samples("om.requeues", &[], TimeRange::ALL).await.expect("series");
    assert_eq!(requeues.len(), 1, "{requeues:?}");
    assert_eq!(requeues[0].key.labels.get("custom.reason").map(String::as_str), Some("lagging"));
    assert_eq!(requeues[0].key.labels.get("lagscope.node.id").map(String::as_str), Some("om-2"));
    assert_eq!(requeues[0].points.last().and_then(|point| point.1), Some(7.0));
    let applied = store
        .series_samples("lagscope.node.applied_state", &[("lagscope.node.id".into(), "om-2".into())], TimeRange::ALL)
        .await
        .expect("series");
    assert_eq!(applied[0].points.last().and_then(|point| point.1), Some(123_456.0));

    let logs = store.logs(TimeRange::ALL, 10).await.expect("logs");
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0].body_text(), "Disable OM follower read and retry OM leader directly");
    assert_eq!(logs[0].severity_number, 13);
    assert_eq!(logs[0].attributes.get("custom.attempt"), Some(&serde_json::json!(3)));
    assert_eq!(logs[0].resource.service_name.as_deref(), Some("ozone-client"));
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_breaking_the_conventions_comes_back_as_grpc_partial_success() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;

    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let request: ExportTraceServiceRequest = serde_json::from_value(serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "c"}}]},
        "scopeSpans": [{"spans": [
            {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "ok",
             "startTimeUnixNano": "1764435600000000000", "endTimeUnixNano": "1764435600010000000",
             "attributes": [{"key": "lagscope.state.carried", "value": {"intValue": "7"}}]},
            {"traceId": "0af7651916cd43dd8448eb211c80319d", "spanId": "b7ad6b7169203332", "name": "bad",
             "startTimeUnixNano": "1764435600000000000", "endTimeUnixNano": "1764435600010000000",
             "attributes": [{"key": "lagscope.state.carried", "value": {"stringValue": "seven"}}]}
        ]}]
    }]}))
    .expect("request");
    let mut client = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr)).await.expect("connect");
    let response = client.export(request).await.expect("OK: the good span is committed").into_inner();
    let partial = response.partial_success.expect("partial success");
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.contains("spans[1]") && partial.error_message.contains("lagscope.state.carried"),
        "{}",
        partial.error_message
    );
    let (_, health) = support::get_json(&server, "/api/v1/health").await;
    assert_eq!(health["store"]["spans"], 1);
    server.shutdown().await.expect("clean shutdown");
}
