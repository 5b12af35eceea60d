//! Retention in `serve`: with `[retention] default = "1d"`, spans, samples-free telemetry and
//! log lines older than a day disappear within a pass or two (SQLite deletes the rows,
//! PostgreSQL drops the old day's partitions), recent data stays and queries still answer.

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
mod support;

use std::time::{Duration, Instant};

use lagscope::{Config, Server};
use serde_json::{Value, json};
use support::{get_json, local_config};

const DAY: u64 = 86_400_000_000_000;

fn now() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since_epoch.as_nanos()).expect("before 2262")
}

/// Client spans of `client`, one per start time.
fn spans(client: &str, starts: &[u64]) -> Value {
    let spans: Vec<Value> = starts
        .iter()
        .enumerate()
        .map(|(index, start)| {
            json!({
                "traceId": format!("{:032x}", index + 1), "spanId": "b7ad6b7169203331", "name": "getFileInfo",
                "startTimeUnixNano": start.to_string(),
                "endTimeUnixNano": (start + 10_000_000).to_string(),
                "attributes": [
                    {"key": "lagscope.client.id", "value": {"stringValue": client}},
                    {"key": "lagscope.namespace", "value": {"stringValue": "ns1"}},
                    {"key": "lagscope.op", "value": {"stringValue": "read"}}
                ]
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "client"}},
            {"key": "lagscope.component", "value": {"stringValue": "client"}}
        ]},
        "scopeSpans": [{"spans": spans}]
    }]})
}

fn logs(times: &[u64]) -> Value {
    let records: Vec<Value> = times
        .iter()
        .map(|time| json!({"timeUnixNano": time.to_string(), "severityNumber": 13, "body": {"stringValue": "a line"}}))
        .collect();
    json!({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": records}]}]})
}

async fn old_data_goes_and_recent_data_stays(mut config: Config) {
    config.retention.all = Some("1d".to_string());
    config.retention.interval_seconds = 1;
    let server = Server::start(&config).await.expect("server starts");
    let http = reqwest::Client::new();
    let (old, recent) = (now() - 3 * DAY, now());
    for (path, body) in [("v1/traces", spans("c1", &[old, old + 1_000, recent])), ("v1/logs", logs(&[old, recent]))] {
        let response =
            http.post(format!("http://{}/{path}", server.otlp_http_addr)).json(&body).send().await.expect("sent");
        assert_eq!(response.status().as_u16(), 200, "{path}");
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, health) = get_json(&server, "/api/v1/health").await;
        if health["store"]["spans"] == 1 && health["store"]["logs"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "old data still there: {health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, timeline) = get_json(&server, "/api/v1/clients/c1/timeline").await;
    assert_eq!(status, 200, "{timeline}");
    let calls = timeline["timelines"][0]["calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 1, "only the recent call: {timeline}");
    let metrics = reqwest::get(format!("http://{}/metrics", server.api_addr)).await.expect("metrics");
    let text = metrics.text().await.expect("text");
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    let removed =
        value("lagscope_retention_rows_deleted_total ") + value("lagscope_retention_partitions_dropped_total ");
    assert!(removed >= 2, "retention counted what it removed:\n{text}");
    assert_eq!(value("lagscope_retention_failures_total "), 0);
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_old_rows_are_deleted() {
    let directory = tempfile::tempdir().expect("temp dir");
    old_data_goes_and_recent_data_stays(local_config(directory.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_old_partitions_are_dropped() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = local_config(directory.path());
    config.server.database_url = Some(postgres_support::fresh_database().await);
    old_data_goes_and_recent_data_stays(config).await;
}

#[test]
fn bad_retention_settings_are_refused_with_the_setting_named() {
    for (setting, message) in [
        ("default = \"14x\"", "retention.spans = \"14x\": unknown unit \"x\""),
        ("logs = \"-3d\"", "retention.logs = \"-3d\": expected a whole number"),
        ("interval_seconds = 0", "retention.interval_seconds must be at least 1"),
    ] {
        let error = Config::from_toml("test.toml", &format!("[retention]\n{setting}\n")).expect_err(setting);
        assert!(format!("{error:#}").contains(message), "{setting}: {error:#}");
    }
    let config =
        Config::from_toml("test.toml", "[retention]\ndefault = \"14d\"\nanomalies = \"90d\"\n").expect("valid");
    assert!(config.retention.is_enabled());
}
