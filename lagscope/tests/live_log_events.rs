//! Live: log lines sent over OTLP/HTTP (`/v1/logs`) make anomalies visible in the API with no
//! span at all: a router's NoNamenodesAvailable lines its `no_namenodes_window`, a Pulsar
//! client's switch lines its `failover_flapping`, also when they name no client (they are
//! the switches of the one client that calls cluster URLs from the node that logged them).

mod support;

use serde_json::{Value, json};
use support::{get_json, start_server, wait_until_analyzed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_alone_raise_windows_and_flapping() {
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

    // A Pulsar client's own switch lines, 20 s apart (its switch-back delay is 60 s).
    let switches: Vec<Value> =
        [(0u64, "pulsar://a:6650", "pulsar://b:6650"), (20, "pulsar://b:6650", "pulsar://a:6650")]
            .iter()
            .map(|(second, from, to)| {
                json!({
                    "timeUnixNano": ((start + second) * 1_000_000_000).to_string(),
                    "body": {"stringValue": format!(
                        "Current Pulsar service is {from}, it has been down for 31000 ms, switch to the service {to}. \
                         The current service down at 1764435600000")},
                    "attributes": [{"key": "lagscope.client.id", "value": {"stringValue": "producer-7"}}]
                })
            })
            .collect();
    let request = json!({"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "lagscope.cluster", "value": {"stringValue": "pulsar-geo"}},
            {"key": "lagscope.component", "value": {"stringValue": "client"}}
        ]},
        "scopeLogs": [{"logRecords": switches}]
    }]});
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/logs", server.otlp_http_addr))
        .json(&request)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    wait_until_analyzed(&server).await;
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=failover_flapping").await;
    let anomalies = listed["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(anomalies.len(), 1, "{listed:#}");
    assert_eq!(anomalies[0]["client_id"], "producer-7");
    assert_eq!(anomalies[0]["evidence"]["source"], "client log");
    server.shutdown().await.expect("clean shutdown");
}

/// Posts `body` (OTLP/HTTP JSON) to `path` of the server; it must be taken.
async fn post(server: &lagscope::Server, path: &str, body: &Value) {
    let response = reqwest::Client::new()
        .post(format!("http://{}{path}", server.otlp_http_addr))
        .json(body)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200, "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_lines_naming_no_client_are_judged_as_their_nodes_clients() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let start = 1_764_435_600u64;
    let nanos = |second: u64| (second * 1_000_000_000).to_string();
    let resource = json!({"attributes": [
        {"key": "service.name", "value": {"stringValue": "orders-app"}},
        {"key": "lagscope.cluster", "value": {"stringValue": "pulsar-east"}},
        {"key": "lagscope.component", "value": {"stringValue": "client"}},
        {"key": "lagscope.node.id", "value": {"stringValue": "orders-app-3"}}
    ]});
    // Its sends went east, then west from 45 s: one switch by the addresses.
    let sends: Vec<Value> = [(0u64, "pulsar-east"), (35, "pulsar-east"), (55, "pulsar-west"), (60, "pulsar-west")]
        .iter()
        .enumerate()
        .map(|(index, (second, address))| {
            let text = |key: &str, value: &str| json!({"key": key, "value": {"stringValue": value}});
            json!({
                "traceId": format!("{:032x}", 0xf1a9_0000 + index),
                "spanId": format!("{:016x}", 0xf1a9_0000 + index),
                "name": "send orders",
                "kind": 3,
                "startTimeUnixNano": nanos(start + second),
                "endTimeUnixNano": nanos(start + second + 1),
                "attributes": [
                    text("lagscope.client.id", "producer-8"),
                    text("lagscope.call.id", &format!("producer-8-{index}")),
                    text("lagscope.namespace", "orders"),
                    text("lagscope.op", "write"),
                    text("rpc.method", "send"),
                    text("server.address", address),
                ],
            })
        })
        .collect();
    post(&server, "/v1/traces", &json!({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": sends}]}]}))
        .await;
    wait_until_analyzed(&server).await;
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=failover_flapping").await;
    assert_eq!(listed["anomalies"].as_array().map(Vec::len), Some(0), "{listed:#}");

    // The process's Pulsar client logs three switches within 40 s, naming no client.
    let lines: Vec<Value> = [(10u64, "east", "west", false), (30, "west", "east", true), (50, "east", "west", false)]
        .iter()
        .map(|(second, from, to, back)| {
            let text = if *back {
                format!(
                    "Current Pulsar service is secondary: pulsar://pulsar-{from}:6650, the primary service: \
                     pulsar://pulsar-{to}:6650 has been recover for 1000 ms, switch back to the primary service"
                )
            } else {
                format!(
                    "Current Pulsar service is pulsar://pulsar-{from}:6650, it has been down for 31000 ms, switch to \
                     the service pulsar://pulsar-{to}:6650. The current service down at 1764435600000"
                )
            };
            json!({"timeUnixNano": nanos(start + second), "severityText": "INFO", "body": {"stringValue": text}})
        })
        .collect();
    post(&server, "/v1/logs", &json!({"resourceLogs": [{"resource": resource, "scopeLogs": [{"logRecords": lines}]}]}))
        .await;
    wait_until_analyzed(&server).await;
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=failover_flapping").await;
    let anomalies = listed["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(anomalies.len(), 1, "{listed:#}");
    assert_eq!(anomalies[0]["client_id"], "producer-8");
    assert_eq!(anomalies[0]["evidence"]["source"], "client log");
    assert_eq!(anomalies[0]["evidence"]["switches"], 3);
    server.shutdown().await.expect("clean shutdown");
}

/// The store finds candidate lines by the phrases its migration lists; the analyzer
/// recognises lines by its own list: they must be the same.
#[test]
fn the_store_marks_exactly_the_phrases_the_analyzer_recognises() {
    let migration = include_str!("../../migrations/sqlite/0007_logs_recognised.sql");
    let marked: Vec<&str> =
        migration.split("instr(body, '").skip(1).filter_map(|rest| rest.split('\'').next()).collect();
    assert_eq!(marked, lagscope_analyzer::log_events::PHRASES, "migration 0007 and log_events::PHRASES differ");
    let postgres = include_str!("../../migrations/postgres/0001_create_schema.sql");
    let marked: Vec<&str> =
        postgres.split("strpos(body, '").skip(1).filter_map(|rest| rest.split('\'').next()).collect();
    assert_eq!(marked, lagscope_analyzer::log_events::PHRASES, "the PostgreSQL schema and PHRASES differ");
}
