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
use lagscope_collector::queue::IngestQueue;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{SqliteStore, Store, StoreStats, TimeRange};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};
use tower::ServiceExt;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp-examples");

struct Harness {
    store: SqliteStore,
    queue: IngestQueue,
    metrics: Arc<SelfMetrics>,
    dirty: Arc<DirtyClients>,
    router: axum::Router,
    _directory: tempfile::TempDir,
}

async fn harness(max_body_bytes: usize) -> Harness {
    harness_with_queue(max_body_bytes, max_body_bytes * 4).await
}

async fn harness_with_queue(max_body_bytes: usize, queue_bytes: usize) -> Harness {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    let dirty = Arc::new(DirtyClients::default());
    let metrics = Arc::new(SelfMetrics::default());
    let (queue, committer) = IngestQueue::new(Arc::new(store.clone()), metrics.clone(), dirty.clone(), queue_bytes);
    tokio::spawn(committer);
    let ingestor = Ingestor { queue: queue.clone(), metrics: metrics.clone() };
    let router = router(ReceiverState { ingestor, max_body_bytes });
    Harness { store, queue, metrics, dirty, router, _directory: directory }
}

impl Harness {
    async fn post(&self, path: &str, content_type: &str, encoding: Option<&str>, body: Vec<u8>) -> Answer {
        let (status, content_type, _, body) = self.post_with_headers(path, content_type, encoding, body).await;
        (status, content_type, body)
    }

    async fn post_with_headers(
        &self,
        path: &str,
        content_type: &str,
        encoding: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, String, axum::http::HeaderMap, Vec<u8>) {
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
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, response_type, headers, bytes.to_vec())
    }

    async fn stats(&self) -> StoreStats {
        self.store.stats().await.expect("stats")
    }
}

type Answer = (StatusCode, String, Vec<u8>);

fn example(name: &str) -> Vec<u8> {
    std::fs::read(format!("{EXAMPLES}/{name}")).expect("official OTLP example")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).expect("deflate");
    encoder.finish().expect("deflate")
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).expect("zstd")
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

    // zstd, as the Collector's exporters send with `compression: zstd`.
    let text = lagscope_span_request(json!({"intValue": "121"}))
        .to_string()
        .replace(r#""c1""#, r#""c2""#)
        .replace("0af76519", "1af76519");
    let request: ExportTraceServiceRequest = serde_json::from_str(&text).expect("request");
    let (status, _, body) =
        harness.post("/v1/traces", "application/x-protobuf", Some("zstd"), zstd(&request.encode_to_vec())).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let spans = harness.store.client_spans("c2", TimeRange::ALL, 10).await.expect("spans");
    assert_eq!(spans.iter().filter_map(|span| span.call.state.carried).collect::<Vec<_>>(), [121]);

    // deflate (zlib), as the Python SDK sends with `compression=Compression.Deflate`.
    let text = text.replace(r#""c2""#, r#""c3""#).replace("1af76519", "2af76519");
    let (status, _, body) =
        harness.post("/v1/traces", "application/json", Some("deflate"), deflate(text.as_bytes())).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(harness.store.client_spans("c3", TimeRange::ALL, 10).await.expect("spans").len(), 2);
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
    let mut truncated_zstd = zstd(&valid);
    truncated_zstd.truncate(truncated_zstd.len() / 2);
    let zstd_bomb = zstd(&vec![b' '; 1 << 20]);
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
        ("/v1/traces", "application/json", Some("zstd"), truncated_zstd, StatusCode::BAD_REQUEST, "invalid zstd body"),
        (
            "/v1/traces",
            "application/json",
            Some("deflate"),
            gzip(&valid),
            StatusCode::BAD_REQUEST,
            "invalid deflate body",
        ),
        (
            "/v1/traces",
            "application/json",
            Some("deflate"),
            deflate(&vec![b' '; 1 << 20]),
            StatusCode::PAYLOAD_TOO_LARGE,
            "exceeds the limit of 4096 bytes",
        ),
        (
            "/v1/traces",
            "application/json",
            Some("zstd"),
            zstd_bomb,
            StatusCode::PAYLOAD_TOO_LARGE,
            "exceeds the limit of 4096 bytes",
        ),
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

#[tokio::test]
async fn a_full_ingest_queue_answers_429_with_retry_after_and_writes_nothing() {
    let harness = harness_with_queue(64 << 10, 256 << 10).await;
    let body = lagscope_span_request(json!({"intValue": "120"})).to_string().into_bytes();
    // Every byte of the queue is held, as by requests still being committed.
    let held = harness.queue.reserve(harness.queue.capacity()).expect("the whole queue");
    for (content_type, payload) in [
        ("application/json", body.clone()),
        (
            "application/x-protobuf",
            serde_json::from_slice::<ExportTraceServiceRequest>(&body).expect("request").encode_to_vec(),
        ),
    ] {
        let (status, response_type, headers, response) =
            harness.post_with_headers("/v1/traces", content_type, None, payload).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", String::from_utf8_lossy(&response));
        assert_eq!(response_type, content_type, "answered in the request's encoding");
        assert_eq!(headers.get(header::RETRY_AFTER).and_then(|value| value.to_str().ok()), Some("1"));
        if content_type == "application/json" {
            let response = json_body(&response);
            assert_eq!(response["code"], json!(8), "RESOURCE_EXHAUSTED: {response}");
            let message = response["message"].as_str().unwrap_or_default();
            assert!(message.contains("ingest queue is full"), "{message}");
        }
    }
    assert_eq!(harness.stats().await.spans, 0);
    assert_eq!(harness.metrics.ingest_queue_full.get(), 2);

    // Once the room is back, the same request is taken, and its room given back after commit.
    drop(held);
    let (status, _, response) = harness.post("/v1/traces", "application/json", None, body).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&response));
    assert_eq!(harness.stats().await.spans, 2);
    assert_eq!(harness.queue.in_use(), 0, "the request's reservation is released after its commit");
}

#[tokio::test]
async fn requests_waiting_together_are_committed_in_one_transaction() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    let dirty = Arc::new(DirtyClients::default());
    let metrics = Arc::new(SelfMetrics::default());
    let (queue, committer) = IngestQueue::new(Arc::new(store.clone()), metrics.clone(), dirty.clone(), 1 << 20);
    let ingestor = Ingestor { queue, metrics: metrics.clone() };
    // Twenty requests queue up while the committer is not running yet (as while it waits for
    // the previous transaction's sync) ...
    let mut requests = tokio::task::JoinSet::new();
    for client in 0..20 {
        let mut request = lagscope_span_request(json!({"intValue": "120"}));
        let spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array_mut().expect("spans");
        for (index, span) in spans.iter_mut().enumerate() {
            span["traceId"] = json!(format!("{:032x}", client * 10 + index + 1));
            span["attributes"][0]["value"]["stringValue"] = json!(format!("c{client}"));
        }
        let request: ExportTraceServiceRequest = serde_json::from_value(request).expect("request");
        let ingestor = ingestor.clone();
        let reservation = ingestor.queue.reserve(1000).expect("room");
        requests.spawn(async move { ingestor.traces(&request, reservation).await });
    }
    while ingestor.queue.in_use() < 20 * 1000 || requests.len() < 20 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // ... and are committed together, each answered only after.
    tokio::spawn(committer);
    while let Some(answer) = requests.join_next().await {
        assert_eq!(answer.expect("task").expect("committed").rejected, 0);
    }
    assert_eq!(store.stats().await.expect("stats").spans, 40);
    assert_eq!(metrics.ingest_committed_requests.get(), 20);
    assert_eq!(metrics.ingest_commits.get(), 1, "one transaction for the twenty requests");
    let pending = dirty.take().await;
    assert_eq!(pending.clients.len(), 20, "every committed client is handed to the analyzer");
    assert_eq!(ingestor.queue.in_use(), 0);
}
