//! The OTLP/HTTP receiver against a real SQLite store, driven in-process.

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use flate2::Compression;
use flate2::write::GzEncoder;
use lagscope_collector::DirtyClients;
use lagscope_collector::otlp::http::{ReceiverState, router};
use lagscope_collector::otlp::ingest::Ingestor;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{SqliteStore, Store, StoreStats, TimeRange};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};
use tower::ServiceExt;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp-examples");

struct Harness {
    store: SqliteStore,
    dirty: Arc<DirtyClients>,
    router: axum::Router,
    _directory: tempfile::TempDir,
}

async fn harness(max_body_bytes: usize) -> Harness {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    let dirty = Arc::new(DirtyClients::default());
    let ingestor =
        Ingestor { store: Arc::new(store.clone()), metrics: Arc::new(SelfMetrics::default()), dirty: dirty.clone() };
    let router = router(ReceiverState { ingestor, max_body_bytes });
    Harness { store, dirty, router, _directory: directory }
}

impl Harness {
    async fn post(
        &self,
        path: &str,
        content_type: &str,
        encoding: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, String, Vec<u8>) {
        let mut request = Request::post(path).header(header::CONTENT_TYPE, content_type);
        if let Some(encoding) = encoding {
            request = request.header(header::CONTENT_ENCODING, encoding);
        }
        let response =
            self.router.clone().oneshot(request.body(Body::from(body)).expect("request")).await.expect("response");
        let status = response.status();
        let response_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, response_type, bytes.to_vec())
    }

    async fn stats(&self) -> StoreStats {
        self.store.stats().await.expect("stats")
    }
}

fn example(name: &str) -> Vec<u8> {
    std::fs::read(format!("{EXAMPLES}/{name}")).expect("official OTLP example")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn json_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON response")
}

fn lagscope_span_request(carried: Value) -> Value {
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "hdfs-client"}},
            {"key": "lagscope.component", "value": {"stringValue": "client"}}
        ]},
        "scopeSpans": [{"spans": [
            {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "create",
             "startTimeUnixNano": "1764435600000000000", "endTimeUnixNano": "1764435600010000000",
             "attributes": [
                {"key": "lagscope.client.id", "value": {"stringValue": "c1"}},
                {"key": "lagscope.state.returned", "value": {"intValue": "120"}}]},
            {"traceId": "0af7651916cd43dd8448eb211c80319d", "spanId": "b7ad6b7169203332", "name": "getFileInfo",
             "startTimeUnixNano": "1764435600020000000", "endTimeUnixNano": "1764435600030000000",
             "attributes": [
                {"key": "lagscope.client.id", "value": {"stringValue": "c1"}},
                {"key": "lagscope.state.carried", "value": carried}]}
        ]}]
    }]})
}

#[tokio::test]
async fn the_official_json_examples_are_accepted_and_kept_whole() {
    let harness = harness(64 << 20).await;
    let (status, content_type, body) =
        harness.post("/v1/traces", "application/json", None, example("trace.json")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/json");
    assert_eq!(json_body(&body), json!({}));
    let (status, _, body) = harness.post("/v1/metrics", "application/json", None, example("metrics.json")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let stats = harness.stats().await;
    assert_eq!((stats.spans, stats.series, stats.samples), (1, 4, 4));

    let counter = harness.store.series_samples("my.counter", &[], TimeRange::ALL).await.expect("series");
    let labels = &counter[0].key.labels;
    assert_eq!(labels.get("my.counter.attr").map(String::as_str), Some("some value"));
    assert_eq!(labels.get("service.name").map(String::as_str), Some("my.service"));
    assert_eq!(labels.get("otel.scope.my.scope.attribute").map(String::as_str), Some("some scope attribute"));
    assert_eq!(counter[0].points[0].1, Some(5.0));
    let histogram = harness.store.series_samples("my.histogram", &[], TimeRange::ALL).await.expect("histogram");
    assert_eq!(histogram[0].points[0].2.as_ref().map(|point| point["bucket_counts"].clone()), Some(json!([1, 1])));
}

#[tokio::test]
async fn the_official_log_examples_are_stored_with_body_and_attributes() {
    let harness = harness(64 << 20).await;
    for name in ["logs.json", "events.json"] {
        let (status, _, body) = harness.post("/v1/logs", "application/json", None, example(name)).await;
        assert_eq!(status, StatusCode::OK, "{name}: {}", String::from_utf8_lossy(&body));
    }
    let logs = harness.store.logs(TimeRange::ALL, 100).await.expect("logs");
    assert_eq!(logs.len(), 2, "{logs:#?}");
    assert!(logs.iter().any(|log| log.body_text() == "Example log record"), "{logs:#?}");
    assert!(logs.iter().any(|log| log.event_name.is_some()), "the event keeps its name: {logs:#?}");
    assert!(logs.iter().all(|log| log.resource.service_name.as_deref() == Some("my.service")));
    assert!(logs.iter().all(|log| !log.attributes.is_empty()), "attributes kept: {logs:#?}");
}

#[tokio::test]
async fn protobuf_and_gzip_are_accepted_and_answered_in_kind() {
    let harness = harness(64 << 20).await;
    let request: ExportTraceServiceRequest =
        serde_json::from_value(lagscope_span_request(json!({"intValue": "120"}))).expect("request");
    let (status, content_type, body) =
        harness.post("/v1/traces", "application/x-protobuf", Some("gzip"), gzip(&request.encode_to_vec())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "application/x-protobuf");
    assert!(body.is_empty(), "an empty ExportTraceServiceResponse encodes to no bytes");
    let spans = harness.store.client_spans("c1", TimeRange::ALL, 10).await.expect("spans");
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[1].call.state.carried, Some(120));
    assert_eq!(spans[0].trace_id.as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
    let pending = harness.dirty.take().await;
    assert!(pending.clients.contains("c1"));
}

#[tokio::test]
async fn a_span_breaking_the_conventions_is_rejected_alone() {
    let harness = harness(64 << 20).await;
    let body = lagscope_span_request(json!({"stringValue": "one hundred"})).to_string().into_bytes();
    let (status, _, response) = harness.post("/v1/traces", "application/json", None, body).await;
    assert_eq!(status, StatusCode::OK);
    let response = json_body(&response);
    assert_eq!(response["partialSuccess"]["rejectedSpans"], json!("1"));
    let message = response["partialSuccess"]["errorMessage"].as_str().unwrap_or_default();
    assert!(message.contains("resourceSpans[0].scopeSpans[0].spans[1]"), "{message}");
    assert!(message.contains("lagscope.state.carried") && message.contains("one hundred"), "{message}");
    assert_eq!(harness.stats().await.spans, 1);
}

/// path, content type, content encoding, body, expected status, expected message part
type BadCase = (&'static str, &'static str, Option<&'static str>, Vec<u8>, StatusCode, &'static str);

#[tokio::test]
async fn malformed_bodies_are_refused_and_nothing_is_written() {
    let harness = harness(4096).await;
    let valid = lagscope_span_request(json!({"intValue": "1"})).to_string().into_bytes();
    let mut truncated_gzip = gzip(&valid);
    truncated_gzip.truncate(truncated_gzip.len() / 2);
    let gzip_bomb = gzip(&vec![b' '; 1 << 20]);
    let cases: Vec<BadCase> = vec![
        (
            "/v1/traces",
            "application/x-protobuf",
            None,
            b"\xff\xff\xff garbage".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid protobuf body",
        ),
        (
            "/v1/metrics",
            "application/x-protobuf",
            None,
            b"\x0a\x05\x0a".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid protobuf body",
        ),
        (
            "/v1/traces",
            "application/json",
            None,
            b"{\"resourceSpans\": [{\"scopeSpans\": [".to_vec(),
            StatusCode::BAD_REQUEST,
            "line 1 column",
        ),
        (
            "/v1/traces",
            "application/json",
            None,
            br#"{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid OTLP JSON body",
        ),
        (
            "/v1/traces",
            "text/plain",
            None,
            valid.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported content type",
        ),
        ("/v1/traces", "application/json", Some("gzip"), truncated_gzip, StatusCode::BAD_REQUEST, "invalid gzip body"),
        (
            "/v1/traces",
            "application/json",
            Some("br"),
            valid.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported content encoding",
        ),
        (
            "/v1/traces",
            "application/json",
            None,
            vec![b' '; 8192],
            StatusCode::PAYLOAD_TOO_LARGE,
            "exceeds the limit of 4096 bytes",
        ),
        (
            "/v1/traces",
            "application/json",
            Some("gzip"),
            gzip_bomb,
            StatusCode::PAYLOAD_TOO_LARGE,
            "exceeds the limit of 4096 bytes",
        ),
    ];
    for (path, content_type, encoding, body, expected_status, expected_message) in cases {
        let (status, _, response) = harness.post(path, content_type, encoding, body).await;
        let text = String::from_utf8_lossy(&response).to_string();
        assert_eq!(status, expected_status, "{path} {content_type} {encoding:?}: {text}");
        assert!(text.contains(expected_message), "{path} {content_type} {encoding:?}: {text}");
    }
    assert_eq!(harness.stats().await, StoreStats::default());
}
