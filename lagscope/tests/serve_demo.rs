//! `lagscope serve --demo`: a new user sees every page filled within seconds.

mod support;

use std::time::{Duration, Instant};

use support::ServeProcess;

#[test]
fn the_demo_fills_the_pages_within_seconds() {
    let directory = tempfile::tempdir().expect("temp dir");
    let serve = ServeProcess::start_with(&directory.path().join("data"), "", &["--demo"]);
    let started = Instant::now();
    let client = reqwest::blocking::Client::new();
    let get = |path: &str| {
        let response = client.get(format!("http://{}{path}", serve.api)).send().expect("request");
        let status = response.status().as_u16();
        (status, response.text().unwrap_or_default())
    };
    // Anomalies appear as the simulated scenario runs in real time.
    let mut anomalies = serde_json::Value::Null;
    while started.elapsed() < Duration::from_secs(60) {
        let (_, body) = get("/api/v1/anomalies?limit=1");
        anomalies = serde_json::from_str(&body).unwrap_or_default();
        if anomalies["anomalies"].as_array().is_some_and(|list| !list.is_empty()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let first = &anomalies["anomalies"][0];
    assert!(first.is_object(), "no anomaly within 60 s of the demo's start: {anomalies}");
    println!("first anomaly after {:.1} s: {}", started.elapsed().as_secs_f64(), first["summary"]);
    // Timestamped now: the data is recent, not the simulator's fixed epoch.
    let now = jiff::Timestamp::now().as_nanosecond() as i64;
    let age = (now - first["start_unix_nano"].as_i64().expect("start")) as f64 / 1e9;
    assert!(age.abs() < 120.0, "the demo's data is {age} s old");
    // Every page answers with data.
    let (status, overview) = get("/");
    assert_eq!(status, 200);
    // (The templates escape `/` in attributes as `&#x2f;`, which browsers read as `/`.)
    let decoded = overview.replace("&#x2f;", "/");
    assert!(decoded.contains("href=\"/anomalies/"), "the overview links an anomaly");
    // Each dashboard draws a chart once its metrics have a few samples.
    for page in ["/dashboards/lag", "/dashboards/routers", "/dashboards/shards", "/dashboards/failover"] {
        loop {
            let (status, body) = get(page);
            assert_eq!(status, 200, "{page}");
            if body.contains("<svg class=\"chart\"") {
                println!("{page} drawn after {:.1} s", started.elapsed().as_secs_f64());
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(90), "{page} draws no chart after 90 s");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let (status, body) = get(&format!("/anomalies/{}", first["id"]));
    assert_eq!(status, 200, "{body}");
    serve.stop();
}

/// A demo started again on the data of an earlier one goes on with the next round: sending
/// round 1's cluster and client names again, with state ids started over, would read as state
/// going backwards and sessions that forgot what they saw, anomalies the demo did not stage.
#[test]
fn a_demo_started_again_goes_on_with_the_next_round() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data = directory.path().join("data");
    let client = reqwest::blocking::Client::new();
    // The clusters of the rounds the demo has sent, once the store holds any.
    let rounds_sent = |serve: &ServeProcess| -> std::collections::BTreeSet<String> {
        let started = Instant::now();
        loop {
            let body = (client.get(format!("http://{}/api/v1/clusters", serve.api)).send())
                .and_then(|response| response.text())
                .unwrap_or_default();
            let clusters: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let rounds: std::collections::BTreeSet<String> = (clusters["clusters"].as_array().into_iter().flatten())
                .filter_map(|cluster| cluster["cluster"].as_str()?.split_once('.').map(|(round, _)| round.to_string()))
                .collect();
            if !rounds.is_empty() {
                return rounds;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "the demo sent nothing within 60 s");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let first = ServeProcess::start_with(&data, "", &["--demo"]);
    assert_eq!(rounds_sent(&first), ["round-1".to_string()].into());
    first.stop();
    let again = ServeProcess::start_with(&data, "", &["--demo"]);
    // The store's clusters now: round 1's, and round 2's once its first telemetry is stored.
    let started = Instant::now();
    while !rounds_sent(&again).contains("round-2") {
        assert!(started.elapsed() < Duration::from_secs(60), "no round 2 within 60 s: {:?}", rounds_sent(&again));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(rounds_sent(&again), ["round-1".to_string(), "round-2".to_string()].into());
    again.stop();
}
