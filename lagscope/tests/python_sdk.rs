//! The OpenTelemetry Python SDK (in a virtualenv installed from PyPI by scripts/python-venv)
//! exports spans, metrics and logs over OTLP/HTTP and over OTLP/gRPC; all arrive in the store
//! with their attributes intact.

mod support;

use std::path::Path;
use std::process::Command;

use lagscope_store::{SqliteStore, Store, TimeRange};
use serde_json::json;
use support::start_server;

/// The virtualenv's python, installed if missing (never skipped: without Python the test fails
/// and says what is missing); once per test process, so that tests running at once do not
/// install it over each other.
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON.get_or_init(install_python).clone()
}

fn install_python() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/python-venv");
    let output = Command::new("bash").arg(&script).output().expect("bash runs scripts/python-venv");
    assert!(
        output.status.success(),
        "scripts/python-venv failed (the OpenTelemetry Python SDK is needed for this test):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 path").trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_exports_over_http_and_grpc_and_everything_arrives_intact() {
    let python = tokio::task::spawn_blocking(python).await.expect("venv");
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/export_all.py");
    let (http, grpc) = (format!("http://{}", server.otlp_http_addr), server.otlp_grpc_addr.to_string());
    let output = tokio::task::spawn_blocking(move || Command::new(&python).arg(&script).arg(http).arg(grpc).output())
        .await
        .expect("python thread")
        .expect("python runs");
    assert!(
        output.status.success(),
        "the Python exporter failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    server.shutdown().await.expect("clean shutdown");

    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    for protocol in ["http", "grpc"] {
        let client = format!("py-{protocol}");
        let spans = store.client_spans(&client, TimeRange::ALL, 100).await.expect("spans");
        assert_eq!(spans.len(), 20, "{protocol}: every span arrived");
        let mut carried: Vec<i64> = spans.iter().filter_map(|span| span.call.state.carried).collect();
        carried.sort_unstable();
        assert_eq!(carried, (500..520).collect::<Vec<_>>(), "{protocol}");
        let span = &spans[0];
        assert_eq!(span.resource.service_name.as_deref(), Some(format!("python-client-{protocol}").as_str()));
        assert_eq!(span.resource.cluster.as_deref(), Some("py-cluster"));
        assert_eq!(span.call.namespace.as_deref(), Some("ns-py"));
        assert_eq!(span.call.rpc_method.as_deref(), Some("getFileInfo"));
        assert_eq!(span.resource.attributes.get("team"), Some(&json!("storage")));
        assert_eq!(span.attributes.get("custom.protocol"), Some(&json!(protocol)));
        assert_eq!(span.attributes.get("custom.list"), Some(&json!(["x", "y"])));
        assert!(span.trace_id.as_deref().is_some_and(|id| id.len() == 32), "{span:?}");

        let matchers = [("custom.protocol".to_string(), protocol.to_string())];
        let requests = store.series_samples("router.rpc.requests", &matchers, TimeRange::ALL).await.expect("series");
        assert_eq!(requests.len(), 1, "{protocol}: {requests:?}");
        assert_eq!(requests[0].key.labels.get("lagscope.node.id").map(String::as_str), Some("router-1"));
        assert_eq!(requests[0].points.last().and_then(|point| point.1), Some(11.0));
        let latency = store.series_samples("router.rpc.latency", &matchers, TimeRange::ALL).await.expect("series");
        assert_eq!(latency.len(), 1, "{protocol}: {latency:?}");
        let point = latency[0].points.last().and_then(|point| point.2.clone()).expect("histogram point");
        assert_eq!(point["count"], json!(3), "{point}");
        assert_eq!(point["sum"], json!(254.5), "{point}");
    }

    let logs = store.logs(TimeRange::ALL, 10).await.expect("logs");
    assert_eq!(logs.len(), 2, "{logs:?}");
    for protocol in ["http", "grpc"] {
        let log = logs
            .iter()
            .find(|log| log.attributes.get("custom.protocol") == Some(&json!(protocol)))
            .unwrap_or_else(|| panic!("the {protocol} log record: {logs:?}"));
        assert_eq!(log.body_text(), "Cannot get available namenode for ns-py");
        assert_eq!(log.severity_text.as_deref(), Some("WARN"));
        assert_eq!(log.attributes.get("lagscope.client.id"), Some(&json!(format!("py-{protocol}"))));
        assert_eq!(log.resource.cluster.as_deref(), Some("py-cluster"));
    }
    store.close().await;
}

/// A capture the Python SDK's own OTLP protobuf encoder wrote, laid out as the Collector's file
/// exporter lays it out with `format: proto` and with `compression: zstd` (spans and a metric
/// in one file): `analyze` finds the read-your-writes stale read in it, from both layouts alike.
#[test]
fn a_capture_the_python_sdk_encoded_as_the_collector_s_file_exporter_writes_it_is_analyzed() {
    let python = python();
    let directory = tempfile::tempdir().expect("temp dir");
    let (proto, zstd) = (directory.path().join("capture.binpb"), directory.path().join("capture.binpb-zstd"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/file_exporter_capture.py");
    let output = Command::new(&python).arg(&script).arg(&proto).arg(&zstd).output().expect("python runs");
    assert!(output.status.success(), "the capture was not written:\n{}", String::from_utf8_lossy(&output.stderr));
    let analyze = |path: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["analyze", "--format", "json", path.to_str().expect("path")])
            .output()
            .expect("lagscope runs");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(output.status.success(), "{stderr}");
        assert!(stderr.contains("3 export requests from 1 file(s): 6 spans, 1 metric samples"), "{stderr}");
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let found = analyze(&proto);
    assert_eq!(analyze(&zstd), found, "both layouts read alike");
    let found: serde_json::Value = serde_json::from_str(&found).expect("JSON");
    let anomalies = found["anomalies"].as_array().expect("anomalies");
    assert_eq!(anomalies.len(), 1, "{found:#}");
    let stale = &anomalies[0];
    assert_eq!(
        (&stale["kind"], &stale["client_id"], &stale["node_id"], &stale["cluster"]),
        (&json!("stale_read"), &json!("py-etl"), &json!("nn-obs1"), &json!("py-file-exporter"))
    );
    let evidence = &stale["evidence"];
    assert_eq!(
        (&evidence["guarantee"], &evidence["floor"], &evidence["served"], &evidence["router"]),
        (&json!("read_your_writes"), &json!(5120), &json!(5100), &json!("router-2"))
    );
    assert_eq!(evidence["spans"].as_array().map(Vec::len), Some(6), "the read's and the write's spans: {evidence:#}");
}
