//! The pages in a real browser: headless Chromium (Debian's `chromium` package) driven by
//! playwright-core (`web/tests/browser`, installed with `npm ci`), against a service fed by the
//! simulator's `mixed` scenario over OTLP/HTTP plus one client whose ids are hostile markup.
//! Screenshots of every page go to `artifacts/pages/` (or `$LAGSCOPE_ARTIFACTS_DIR/pages`).
//!
//! `.ci/run` installs Chromium and the npm package; on a machine without them this test fails
//! and says what to install: a browser test that cannot run is not a pass.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::{get_json, start_server, wait_until_analyzed_within};

/// A client id that is markup, quotes and a very long string: shown as text, or the test fails.
fn hostile_client() -> String {
    format!("<script>window.__lagscopePwned=true</script>\"'&amp;{}", "x".repeat(2_000))
}
const HOSTILE_NAMESPACE: &str = "ns<img src=x onerror=\"window.__lagscopePwned=true\">";
const HOSTILE_NODE: &str = "nn-<b onmouseover=alert(1)>observer</b>";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// OTLP/JSON of one write (served by the active) then one read the observer serves below
/// it: a read-your-writes stale read whose client, namespace and node are hostile.
fn hostile_payload(client: &str, base_nanos: i64) -> serde_json::Value {
    let attribute = |key: &str, value: serde_json::Value| match value {
        serde_json::Value::Number(number) => json!({ "key": key, "value": { "intValue": number.to_string() } }),
        other => json!({ "key": key, "value": { "stringValue": other } }),
    };
    let resource = |service: &str, component: &str, node: &str| {
        json!({ "attributes": [
            attribute("service.name", json!(service)),
            attribute("lagscope.system", json!("hdfs-rbf")),
            attribute("lagscope.cluster", json!("hostile-cluster")),
            attribute("lagscope.component", json!(component)),
            attribute("lagscope.node.id", json!(node)),
        ]})
    };
    let span = |trace: u8,
                id: u8,
                parent: Option<u8>,
                name: &str,
                start_ms: i64,
                end_ms: i64,
                attributes: Vec<serde_json::Value>| {
        let mut span = json!({
            "traceId": format!("{:032x}", 0xabc0_u128 + u128::from(trace)),
            "spanId": format!("{:016x}", 0xdef0_u64 + u64::from(id)),
            "name": name,
            "kind": 3,
            "startTimeUnixNano": (base_nanos + start_ms * 1_000_000).to_string(),
            "endTimeUnixNano": (base_nanos + end_ms * 1_000_000).to_string(),
            "attributes": attributes,
        });
        if let Some(parent) = parent {
            span["parentSpanId"] = json!(format!("{:016x}", 0xdef0_u64 + u64::from(parent)));
            span["kind"] = json!(2);
        }
        span
    };
    let client_attributes = |call: &str, op: &str, carried: i64, returned: i64| {
        vec![
            attribute("lagscope.client.id", json!(client)),
            attribute("lagscope.call.id", json!(call)),
            attribute("lagscope.namespace", json!(HOSTILE_NAMESPACE)),
            attribute("lagscope.op", json!(op)),
            attribute("lagscope.attempt", json!(0)),
            attribute("lagscope.target.node", json!("router-1")),
            attribute("lagscope.state.carried", json!(carried)),
            attribute("lagscope.state.returned", json!(returned)),
            attribute("lagscope.outcome", json!("ok")),
        ]
    };
    let router_attributes = |target: &str, carried: i64| {
        vec![
            attribute("lagscope.client.id", json!(client)),
            attribute("lagscope.namespace", json!(HOSTILE_NAMESPACE)),
            attribute("lagscope.state.carried", json!(carried)),
            attribute("lagscope.state.router", json!(carried)),
            attribute("lagscope.target.node", json!(target)),
        ]
    };
    let server_attributes = |role: &str, served: i64| {
        vec![
            attribute("lagscope.namespace", json!(HOSTILE_NAMESPACE)),
            attribute("lagscope.node.role", json!(role)),
            attribute("lagscope.state.served", json!(served)),
            attribute("lagscope.state.returned", json!(served)),
        ]
    };
    let scope = |spans: Vec<serde_json::Value>| json!([{ "scope": { "name": "hostile" }, "spans": spans }]);
    json!({ "resourceSpans": [
        { "resource": resource("hdfs-client", "client", "app-1"), "scopeSpans": scope(vec![
            span(1, 1, None, "create", 0, 10, client_attributes("w-1", "write", 100, 200)),
            span(2, 4, None, "getFileInfo", 20, 30, client_attributes("r-1", "read", 200, 200)),
        ])},
        { "resource": resource("hdfs-router", "router", "router-1"), "scopeSpans": scope(vec![
            span(1, 2, Some(1), "create", 1, 9, router_attributes("nn-active", 100)),
            span(2, 5, Some(4), "getFileInfo", 21, 29, router_attributes(HOSTILE_NODE, 200)),
        ])},
        { "resource": resource("hdfs-namenode", "server", "nn-active"), "scopeSpans": scope(vec![
            span(1, 3, Some(2), "create", 2, 8, server_attributes("active", 200)),
        ])},
        { "resource": resource("hdfs-namenode", "server", HOSTILE_NODE), "scopeSpans": scope(vec![
            span(2, 6, Some(5), "getFileInfo", 22, 28, server_attributes("observer", 150)),
        ])},
    ]})
}

/// `npm ci` in web/tests/browser when playwright-core is missing (CI installs it first).
fn browser_driver() -> PathBuf {
    let directory = repository().join("web/tests/browser");
    if !directory.join("node_modules/playwright-core").is_dir() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&directory)
            .status()
            .unwrap_or_else(|error| panic!("cannot run npm ({error}): install Node.js and npm, or run .ci/run"));
        assert!(status.success(), "npm ci in {} failed", directory.display());
    }
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium package (`apt-get install -y chromium`; .ci/run does)"
    );
    directory.join("pages.mjs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_in_chromium_and_shows_hostile_telemetry_as_text() {
    let driver = browser_driver();
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    support::feed_simulator(&server, "mixed", 15).await;
    // The hostile client, a minute after the simulated data (the simulator's clock).
    let (_, latest) = get_json(&server, "/api/v1/anomalies?limit=1").await;
    let base =
        latest["anomalies"][0]["end_unix_nano"].as_i64().expect("the simulator's anomalies") + 60 * 1_000_000_000;
    let client = hostile_client();
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .json(&hostile_payload(&client, base))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());
    wait_until_analyzed_within(&server, Duration::from_secs(60)).await;
    let (_, hostile) =
        get_json(&server, &format!("/api/v1/anomalies?kind=stale_read&client={}", urlencode(&client))).await;
    assert_eq!(hostile["anomalies"].as_array().map(Vec::len), Some(1), "the hostile client's stale read: {hostile}");

    let artifacts = std::env::var_os("LAGSCOPE_ARTIFACTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repository().join("artifacts"))
        .join("pages");
    let base_url = format!("http://{}", server.api_addr);
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(&driver)
            .args(["--base", &base_url, "--artifacts"])
            .arg(&artifacts)
            .args(["--hostile", &client])
            .output()
            .expect("node runs")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(output.status.success(), "browser checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all pages passed"), "{stdout}");
    server.shutdown().await.expect("clean shutdown");
}

fn urlencode(text: &str) -> String {
    lagscope_web::ui::encode_path(text)
}
