//! Live: a router's log lines sent over OTLP/HTTP (`/v1/logs`) make its
//! `no_namenodes_window` visible in the API, with no span from that router at all.

mod support;

use serde_json::{Value, json};
use support::{get_json, start_server, wait_until_analyzed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_log_lines_alone_raise_the_no_namenodes_window() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let start = 1_764_435_600u64;
    let records: Vec<Value> = (0..=30u64)
        .step_by(2)
        .map(|second| {
            json!({
                "timeUnixNano": ((start + second) * 1_000_000_000).to_string(),
                "severityNumber": 13,
                "severityText": "WARN",
                "body": {"stringValue": format!(
                    "Cannot get available namenode for ns7 nn-a.example:8020 error: \
                     No namenodes available under nameservice ns7 (attempt at +{second}s)")},
            })
        })
        .collect();
    let request = json!({"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "hdfs-router"}},
            {"key": "lagscope.cluster", "value": {"stringValue": "prod-west"}},
            {"key": "lagscope.component", "value": {"stringValue": "router"}},
            {"key": "lagscope.node.id", "value": {"stringValue": "router-9"}}
        ]},
        "scopeLogs": [{"logRecords": records}]
    }]});
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/logs", server.otlp_http_addr))
        .json(&request)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    wait_until_analyzed(&server).await;
    let (status, listed) = get_json(&server, "/api/v1/anomalies?kind=no_namenodes_window").await;
    assert_eq!(status, 200, "{listed}");
    let anomalies = listed["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(anomalies.len(), 1, "{listed:#}");
    let window = &anomalies[0];
    assert_eq!(window["node_id"], "router-9");
    assert_eq!(window["namespace"], "ns7");
    assert_eq!(window["cluster"], "prod-west");
    assert_eq!(window["evidence"]["attempts"], 16, "{window:#}");
    assert_eq!(window["evidence"]["window_seconds"], 30.0, "{window:#}");
    server.shutdown().await.expect("clean shutdown");
}
