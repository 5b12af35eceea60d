//! Live: OTLP delivery is at least once. An exporter whose request was received but whose
//! acknowledgement was lost sends the request again. The service must store what it stored
//! for the telemetry sent once (each span, sample and log record once) and report what it
//! reports for it: the same anomalies with the same evidence, and timelines with each attempt
//! once.

mod support;

use serde_json::Value;
use support::{feed_simulator, get_json, start_server};

/// The anomalies as the API lists them, without what only says when the service stored them.
async fn anomalies(server: &lagscope::Server) -> Vec<Value> {
    let (status, body) = get_json(server, "/api/v1/anomalies?limit=1000").await;
    assert_eq!(status, 200, "{body}");
    let mut listed: Vec<Value> = body["anomalies"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|anomaly| {
            let fields = ["kind", "fingerprint", "cluster", "namespace", "client_id", "node_id", "start_unix_nano"];
            let mut kept: serde_json::Map<String, Value> =
                fields.iter().map(|field| (field.to_string(), anomaly[*field].clone())).collect();
            for field in ["end_unix_nano", "summary", "cause", "evidence", "severity"] {
                kept.insert(field.to_string(), anomaly[field].clone());
            }
            Value::Object(kept)
        })
        .collect();
    listed.sort_by_key(|anomaly| anomaly.to_string());
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_sent_twice_is_reported_as_sent_once() {
    let scenarios = [("ozone-pinned-retry", 60), ("hdfs-no-namenodes", 40)];
    let once_dir = tempfile::tempdir().expect("temp dir");
    let once = start_server(once_dir.path()).await;
    let twice_dir = tempfile::tempdir().expect("temp dir");
    let twice = start_server(twice_dir.path()).await;
    for (scenario, seconds) in scenarios {
        feed_simulator(&once, scenario, seconds).await;
        // The same seed gives the same bytes: every span, sample and log line comes again.
        feed_simulator(&twice, scenario, seconds).await;
        feed_simulator(&twice, scenario, seconds).await;
    }

    let (_, stats_once) = get_json(&once, "/api/v1/health").await;
    let (_, stats_twice) = get_json(&twice, "/api/v1/health").await;
    assert!(stats_once["store"]["logs"].as_u64().expect("a count") > 0, "{stats_once}");
    for table in ["spans", "series", "samples", "logs"] {
        assert_eq!(
            stats_twice["store"][table], stats_once["store"][table],
            "{table}: {stats_twice} against {stats_once}"
        );
    }
    let expected = anomalies(&once).await;
    let kinds: std::collections::BTreeSet<&str> =
        expected.iter().filter_map(|anomaly| anomaly["kind"].as_str()).collect();
    assert!(kinds.contains("pinned_retry") && kinds.contains("no_namenodes_window"), "{kinds:?}");
    assert_eq!(anomalies(&twice).await, expected, "sent twice: {stats_twice} against {stats_once}");

    // The pinned read's timeline: each attempt once.
    let pinned = expected.iter().find(|anomaly| anomaly["kind"] == "pinned_retry").expect("a pinned retry");
    let client = pinned["client_id"].as_str().expect("a pinned retry names its client");
    let path = format!("/api/v1/clients/{client}/timeline");
    let (_, timeline_once) = get_json(&once, &path).await;
    let (_, timeline_twice) = get_json(&twice, &path).await;
    let attempts = |timeline: &Value| -> usize {
        timeline["timelines"]
            .as_array()
            .expect("timelines")
            .iter()
            .flat_map(|timeline| timeline["calls"].as_array().expect("calls"))
            .map(|call| call["attempts"].as_array().expect("attempts").len())
            .sum()
    };
    assert!(attempts(&timeline_once) > 0);
    assert_eq!(attempts(&timeline_twice), attempts(&timeline_once));
    assert_eq!(timeline_twice, timeline_once);
}
