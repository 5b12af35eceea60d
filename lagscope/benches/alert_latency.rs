//! Paging latency: time from sending the span that completes an anomaly to a receiver getting
//! the alert. `cargo bench -p lagscope --bench alert_latency`.
//!
//! `serve` runs in-process over SQLite with one webhook receiver (a local HTTP server that
//! notes when each alert arrives) and a route for every anomaly. Each trial posts one OTLP/HTTP
//! request holding a client's write and a later read served below it by a server of its own
//! (so each trial is a new incident), and waits for the webhook of that server's incident.
//! Reported: p50, p99 and max of that latency, next to the same requests' acknowledgement and
//! the anomaly's appearance in the API (both measured in the same run), idle and under
//! background load (the simulator streaming `hdfs-observer-healthy` into the same server).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use lagscope::Server;
use lagscope::alerting::AlertsConfig;
use lagscope_alerts::{Receiver, ReceiverKind, Route};

const TRIALS: usize = 60;

/// When each server's incident first reached the webhook.
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

async fn hook(State(arrivals): State<Arrivals>, body: String) -> &'static str {
    let now = Instant::now();
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&body)
        && let Some(node) = value["commonLabels"]["node"].as_str()
    {
        arrivals.lock().expect("arrivals").entry(node.to_string()).or_insert(now);
    }
    "ok"
}

fn percentile(values: &mut [f64], quantile: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * quantile).round() as usize]
}

async fn trials(server: &Server, arrivals: &Arrivals, offset: usize) -> [Vec<f64>; 3] {
    let client = reqwest::Client::new();
    let (mut ack, mut listed, mut paged) = (Vec::new(), Vec::new(), Vec::new());
    for trial in offset..offset + TRIALS {
        let node = format!("nn-bench-{trial}");
        let started = Instant::now();
        ack.push(support::post_stale_read(&client, server, trial, &node).await.as_secs_f64() * 1e3);
        let url = format!("http://{}/api/v1/anomalies?client=bench-{trial}", server.api_addr);
        let mut seen_in_api = None;
        loop {
            if seen_in_api.is_none() {
                let found: serde_json::Value = client.get(&url).send().await.expect("api").json().await.expect("json");
                if found["anomalies"].as_array().is_some_and(|anomalies| !anomalies.is_empty()) {
                    seen_in_api = Some(started.elapsed());
                }
            }
            if let Some(arrived) = arrivals.lock().expect("arrivals").get(&node) {
                paged.push(arrived.duration_since(started).as_secs_f64() * 1e3);
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "trial {trial}: no alert after 30 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        listed.push(seen_in_api.map_or(f64::NAN, |at| at.as_secs_f64() * 1e3));
    }
    [ack, listed, paged]
}

fn report(label: &str, [mut ack, listed, mut paged]: [Vec<f64>; 3]) {
    // How long after the anomaly was listed its alert arrived: the alerting path alone.
    let mut after_listed: Vec<f64> = paged
        .iter()
        .zip(&listed)
        .filter(|(_, listed)| listed.is_finite())
        .map(|(paged, listed)| paged - listed)
        .collect();
    let mut listed: Vec<f64> = listed.into_iter().filter(|value| value.is_finite()).collect();
    let (p50, p99, max) = (percentile(&mut paged, 0.5), percentile(&mut paged, 0.99), percentile(&mut paged, 1.0));
    println!(
        "{label:<28} trials {TRIALS}  alert received p50 {p50:6.1} ms  p99 {p99:6.1} ms  max {max:6.1} ms  | ack p50 {:5.1} ms  anomaly in API p50 {:6.1} ms p99 {:6.1} ms  alert after listed p50 {:6.1} ms p99 {:6.1} ms",
        percentile(&mut ack, 0.5),
        percentile(&mut listed, 0.5),
        percentile(&mut listed, 0.99),
        percentile(&mut after_listed, 0.5),
        percentile(&mut after_listed, 0.99),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let arrivals: Arrivals = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hook_addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(hook).with_state(arrivals.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("webhook serves") });

    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    config.alerts = AlertsConfig {
        receivers: vec![Receiver {
            name: "hook".to_string(),
            kind: ReceiverKind::Webhook { url: format!("http://{hook_addr}/hook") },
        }],
        routes: vec![Route { receiver: "hook".to_string(), ..Route::default() }],
        ..AlertsConfig::default()
    };
    println!("store: SQLite; alerter poll interval {} ms (the default)", config.alerts.poll_interval_ms);
    let server = Server::start(&config).await.expect("server");
    report("idle", trials(&server, &arrivals, 0).await);

    support::start_background_load(&server).await;
    report("under load (400 ops/s sim)", trials(&server, &arrivals, 1_000).await);
    let (_, health) = support::get_json(&server, "/api/v1/health").await;
    let (_, messages) = support::get_json(&server, "/api/v1/alerts?limit=1000").await;
    println!(
        "anomalies stored {}, alert messages {}",
        health["store"]["anomalies"],
        messages["messages"].as_array().map_or(0, Vec::len)
    );
    // The load thread paces in real time; the process ends here.
    std::process::exit(0);
}
