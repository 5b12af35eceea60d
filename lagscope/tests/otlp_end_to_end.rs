//! Telemetry in through a real OpenTelemetry OTLP/HTTP exporter, stored, analyzed live,
//! answered over the API.

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
mod support;

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value;
use support::{get_json, local_config, wait_until_analyzed};

/// One participant: a tracer provider whose resource says who it is. Its exporter compresses
/// protobuf with zstd and JSON with gzip (both as the Collector's exporters may).
fn provider(endpoint: &str, protocol: Protocol, service: &str, component: &str, node: &str) -> SdkTracerProvider {
    let compression = match protocol {
        Protocol::HttpBinary => opentelemetry_otlp::Compression::Zstd,
        _ => opentelemetry_otlp::Compression::Gzip,
    };
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_compression(compression)
        .with_endpoint(endpoint)
        .build()
        .expect("exporter");
    let resource = Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", service.to_string()),
            KeyValue::new("lagscope.system", "hdfs-rbf"),
            KeyValue::new("lagscope.cluster", "prod-east"),
            KeyValue::new("lagscope.component", component.to_string()),
            KeyValue::new("lagscope.node.id", node.to_string()),
        ])
        .build();
    SdkTracerProvider::builder().with_resource(resource).with_simple_exporter(exporter).build()
}

struct Hop<'a> {
    name: &'a str,
    start_ms: u64,
    end_ms: u64,
    attributes: Vec<KeyValue>,
}

/// Emits one client → router → server call with explicit times; returns nothing, exports on end.
fn emit_call(
    client: &SdkTracerProvider,
    router: &SdkTracerProvider,
    server: &SdkTracerProvider,
    base: SystemTime,
    hops: [Hop<'_>; 3],
) {
    let at = |ms: u64| base + Duration::from_millis(ms);
    let [client_hop, router_hop, server_hop] = hops;
    let client_tracer = client.tracer("hdfs-client");
    let client_span = client_tracer
        .span_builder(client_hop.name.to_string())
        .with_kind(SpanKind::Client)
        .with_start_time(at(client_hop.start_ms))
        .with_attributes(client_hop.attributes)
        .start(&client_tracer);
    let client_context = Context::current_with_span(client_span);

    let router_tracer = router.tracer("hdfs-router");
    let router_span = router_tracer
        .span_builder(router_hop.name.to_string())
        .with_kind(SpanKind::Server)
        .with_start_time(at(router_hop.start_ms))
        .with_attributes(router_hop.attributes)
        .start_with_context(&router_tracer, &client_context);
    let router_context = client_context.with_span(router_span);

    let server_tracer = server.tracer("hdfs-namenode");
    let mut server_span = server_tracer
        .span_builder(server_hop.name.to_string())
        .with_kind(SpanKind::Server)
        .with_start_time(at(server_hop.start_ms))
        .with_attributes(server_hop.attributes)
        .start_with_context(&server_tracer, &router_context);
    opentelemetry::trace::Span::end_with_timestamp(&mut server_span, at(server_hop.end_ms));
    router_context.span().end_with_timestamp(at(router_hop.end_ms));
    client_context.span().end_with_timestamp(at(client_hop.end_ms));
}

fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

/// A write returning `write_returned`, then a read the observer serves at `read_served`.
fn export_write_then_read(
    endpoint: String,
    protocol: Protocol,
    client_id: &'static str,
    write_returned: i64,
    read_served: i64,
) {
    let client = provider(&endpoint, protocol, "hdfs-client", "client", "app-host-1");
    let router = provider(&endpoint, protocol, "hdfs-router", "router", "router-1");
    let observer = provider(&endpoint, protocol, "hdfs-namenode", "server", "nn-observer-1");
    let active = provider(&endpoint, protocol, "hdfs-namenode", "server", "nn-active");
    let base = SystemTime::now() - Duration::from_secs(5);
    let common = |call: &'static str, op: &'static str| {
        vec![
            kv("lagscope.client.id", client_id),
            kv("lagscope.call.id", call),
            kv("lagscope.namespace", "ns1"),
            kv("lagscope.op", op),
        ]
    };
    let with = |mut base_attributes: Vec<KeyValue>, more: Vec<KeyValue>| {
        base_attributes.extend(more);
        base_attributes
    };
    emit_call(
        &client,
        &router,
        &active,
        base,
        [
            Hop {
                name: "create",
                start_ms: 0,
                end_ms: 10,
                attributes: with(
                    common("w-1", "write"),
                    vec![
                        kv("rpc.method", "create"),
                        kv("lagscope.attempt", 0),
                        kv("lagscope.target.node", "router-1"),
                        kv("lagscope.state.carried", 100),
                        kv("lagscope.state.returned", write_returned),
                        kv("lagscope.outcome", "ok"),
                    ],
                ),
            },
            Hop {
                name: "create",
                start_ms: 1,
                end_ms: 9,
                attributes: vec![
                    kv("lagscope.client.id", client_id),
                    kv("lagscope.namespace", "ns1"),
                    kv("lagscope.state.carried", 100),
                    kv("lagscope.state.router", write_returned),
                    kv("lagscope.target.node", "nn-active"),
                ],
            },
            Hop {
                name: "create",
                start_ms: 2,
                end_ms: 8,
                attributes: vec![
                    kv("lagscope.namespace", "ns1"),
                    kv("lagscope.node.role", "active"),
                    kv("lagscope.state.served", write_returned),
                    kv("lagscope.state.returned", write_returned),
                ],
            },
        ],
    );
    emit_call(
        &client,
        &router,
        &observer,
        base,
        [
            Hop {
                name: "getFileInfo",
                start_ms: 20,
                end_ms: 30,
                attributes: with(
                    common("r-1", "read"),
                    vec![
                        kv("rpc.method", "getFileInfo"),
                        kv("lagscope.attempt", 0),
                        kv("lagscope.target.node", "router-1"),
                        kv("lagscope.state.carried", write_returned),
                        kv("lagscope.state.returned", write_returned),
                        kv("lagscope.outcome", "ok"),
                    ],
                ),
            },
            Hop {
                name: "getFileInfo",
                start_ms: 21,
                end_ms: 29,
                attributes: vec![
                    kv("lagscope.client.id", client_id),
                    kv("lagscope.namespace", "ns1"),
                    kv("lagscope.state.carried", write_returned),
                    kv("lagscope.state.router", write_returned),
                    kv("lagscope.target.node", "nn-observer-1"),
                ],
            },
            Hop {
                name: "getFileInfo",
                start_ms: 22,
                end_ms: 28,
                attributes: vec![
                    kv("lagscope.namespace", "ns1"),
                    kv("lagscope.node.role", "observer"),
                    kv("lagscope.state.served", read_served),
                    kv("lagscope.state.returned", read_served),
                    kv("lagscope.requeues", 0),
                    kv("my.custom.attribute", "kept"),
                ],
            },
        ],
    );
    for participant in [client, router, observer, active] {
        participant.shutdown().expect("exporter flushes");
    }
}

async fn export(
    server: &lagscope::Server,
    protocol: Protocol,
    client_id: &'static str,
    write_returned: i64,
    read_served: i64,
) {
    let endpoint = format!("http://{}/v1/traces", server.otlp_http_addr);
    tokio::task::spawn_blocking(move || {
        export_write_then_read(endpoint, protocol, client_id, write_returned, read_served)
    })
    .await
    .expect("exporter thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_your_writes_violation_sent_by_a_real_exporter_is_reported_with_its_evidence() {
    let directory = tempfile::tempdir().expect("temp dir");
    violation_is_reported_with_its_evidence(local_config(directory.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_read_your_writes_violation_is_reported_with_its_evidence() {
    let directory = tempfile::tempdir().expect("temp dir");
    violation_is_reported_with_its_evidence(postgres_config(directory.path()).await).await;
}

/// The service's configuration with its store in a fresh PostgreSQL database.
async fn postgres_config(directory: &std::path::Path) -> lagscope::Config {
    let mut config = local_config(directory);
    config.server.database_url = Some(postgres_support::fresh_database().await);
    config
}

async fn violation_is_reported_with_its_evidence(config: lagscope::Config) {
    let server = lagscope::Server::start(&config).await.expect("server starts");

    // A clean history first (protobuf): the observer had caught up.
    export(&server, Protocol::HttpBinary, "clean-client", 120, 125).await;
    // Then the violation (JSON): the observer serves at 110 after the write returned 120.
    export(&server, Protocol::HttpJson, "stale-client", 120, 110).await;

    // Every batch of both histories is committed (the exporters returned) and analyzed.
    wait_until_analyzed(&server).await;
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["store"]["spans"], 12, "{health}");
    let (_, listed) = get_json(&server, "/api/v1/anomalies").await;
    let anomalies = listed["anomalies"].as_array().cloned().unwrap_or_default();

    assert_eq!(anomalies.len(), 1, "exactly the one stale read: {anomalies:#?}");
    let anomaly = &anomalies[0];
    assert_eq!(anomaly["kind"], "stale_read");
    assert_eq!(anomaly["client_id"], "stale-client");
    assert_eq!(anomaly["cluster"], "prod-east");
    assert_eq!(anomaly["namespace"], "ns1");
    assert_eq!(anomaly["node_id"], "nn-observer-1");
    let evidence = &anomaly["evidence"];
    assert_eq!(evidence["guarantee"], "read_your_writes");
    assert_eq!(evidence["floor"], 120);
    assert_eq!(evidence["served"], 110);
    assert_eq!(evidence["floor_set_by"]["rpc_method"], "create");
    assert_eq!(evidence["read"]["rpc_method"], "getFileInfo");
    assert_eq!(evidence["spans"].as_array().map(Vec::len), Some(6), "{evidence:#}");
    assert!(anomaly["cause"].as_str().unwrap_or_default().contains("did not requeue"), "{anomaly:#}");

    let (status, clean) = get_json(&server, "/api/v1/anomalies?client=clean-client").await;
    assert_eq!(status, 200);
    assert_eq!(clean["anomalies"], Value::Array(Vec::new()));

    // The same story as a timeline: write then read, joined across client, router, server.
    let (status, timeline) = get_json(&server, "/api/v1/clients/stale-client/timeline").await;
    assert_eq!(status, 200, "{timeline}");
    let calls = &timeline["timelines"][0]["calls"];
    assert_eq!(calls[0]["rpc_method"], "create");
    assert_eq!(calls[1]["floor"], 120);
    assert_eq!(calls[1]["attempts"][0]["served_by"], "nn-observer-1");
    assert_eq!(calls[1]["attempts"][0]["join"], "trace_context");

    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sent_before_a_restart_is_there_after_it() {
    let directory = tempfile::tempdir().expect("temp dir");
    survives_a_restart(local_config(directory.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_data_sent_before_a_restart_is_there_after_it() {
    let directory = tempfile::tempdir().expect("temp dir");
    survives_a_restart(postgres_config(directory.path()).await).await;
}

async fn survives_a_restart(config: lagscope::Config) {
    let server = lagscope::Server::start(&config).await.expect("server starts");
    export(&server, Protocol::HttpBinary, "stale-client", 300, 290).await;
    wait_until_analyzed(&server).await;
    let (_, before) = get_json(&server, "/api/v1/anomalies").await;
    assert_eq!(before["anomalies"].as_array().map(Vec::len), Some(1), "{before}");
    let (_, timeline_before) = get_json(&server, "/api/v1/clients/stale-client/timeline").await;
    server.shutdown().await.expect("clean shutdown");

    let restarted = lagscope::Server::start(&config).await.expect("server restarts");
    let (_, health) = get_json(&restarted, "/api/v1/health").await;
    assert_eq!(health["store"]["spans"], 6, "{health}");
    let (_, after) = get_json(&restarted, "/api/v1/anomalies").await;
    assert_eq!(after, before);
    let (_, timeline_after) = get_json(&restarted, "/api/v1/clients/stale-client/timeline").await;
    assert_eq!(timeline_after, timeline_before);
    restarted.shutdown().await.expect("clean shutdown");
}
