//! `/api/v1/lag` serves at most its turns at once: a request beyond them waits for one, and
//! one that waited in vain gets 503 with `Retry-After`, counted on `/metrics`; once the turn
//! is free again, requests are served.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use lagscope_model::LagReport;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{SqliteStore, Store};
use lagscope_web::{ApiState, LagAggregator, LagTurns, router};
use serde_json::Value;
use tower::ServiceExt;

const LAG: &str = "/api/v1/lag?from=1700000000&to=1700000600";

async fn get(app: &Router, uri: &str) -> (StatusCode, Option<String>, String) {
    let response = app.clone().oneshot(Request::get(uri).body(Body::empty()).expect("request")).await.expect("answer");
    let status = response.status();
    let retry_after =
        response.headers().get(header::RETRY_AFTER).map(|value| value.to_str().expect("ASCII").to_string());
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, retry_after, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// The value of an unlabelled metric in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
        .parse()
        .expect("a number")
}

/// The API over an empty store with `aggregate` as its lag aggregator and `turns`.
async fn api(aggregate: LagAggregator, turns: LagTurns) -> (Router, Arc<SelfMetrics>, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
    let metrics = Arc::new(SelfMetrics::default());
    let state = ApiState {
        store,
        metrics: metrics.clone(),
        lag: Some(aggregate),
        instance: None,
        call_horizon: 90_000_000_000,
        lag_turns: turns,
    };
    (router(state), metrics, directory)
}

fn empty_report(query: &lagscope_model::LagQuery) -> LagReport {
    LagReport { query: query.clone(), reads: Vec::new(), apply_lag: Vec::new(), rejections: Vec::new() }
}

/// Sends a lag request and waits until its aggregation has begun (`entered` hears from it):
/// it holds a turn from then on.
async fn first_request(
    app: &Router,
    entered: mpsc::Receiver<()>,
) -> tokio::task::JoinHandle<(StatusCode, Option<String>, String)> {
    let first = tokio::spawn({
        let app = app.clone();
        async move { get(&app, LAG).await }
    });
    tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(30)))
        .await
        .expect("join")
        .expect("the first request reaches its aggregation");
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_turns_waits_then_is_refused_with_a_retry_hint() {
    // The aggregation of the first request blocks until the test lets it go: it holds the
    // only turn meanwhile. Later requests aggregate straight away.
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(Some((entered_tx, release_rx))));
    let aggregate: LagAggregator = Arc::new(move |_rows, query| {
        let first = gate.lock().expect("gate").take();
        if let Some((entered, release)) = first {
            entered.send(()).expect("the test waits");
            release.recv().expect("the test lets it go");
        }
        Ok(empty_report(query))
    });
    let (app, metrics, _directory) = api(aggregate, LagTurns::new(1, Duration::from_millis(300))).await;
    let first = first_request(&app, entered).await;

    let (_, _, text) = get(&app, "/metrics").await;
    assert_eq!(metric(&text, "lagscope_api_lag_requests_served"), 1.0);

    let (status, retry_after, body) = get(&app, LAG).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry_after.as_deref(), Some("5"));
    let message = serde_json::from_str::<Value>(&body).expect("JSON")["error"].as_str().expect("a message").to_string();
    assert!(message.contains("server.max_concurrent_lag_requests"), "{message}");
    assert!(message.contains("1 requests are being served"), "{message}");
    assert!(message.contains("waited 300ms"), "{message}");
    assert_eq!(metrics.api_lag_requests_refused.get(), 1);
    let (_, _, text) = get(&app, "/metrics").await;
    assert_eq!(metric(&text, "lagscope_api_lag_requests_refused_total"), 1.0);

    release.send(()).expect("the first request waits");
    let (status, _, body) = first.await.expect("join");
    assert_eq!(status, StatusCode::OK, "{body}");
    // Its turn is given back: the next request is served.
    let (status, _, body) = get(&app, LAG).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, _, text) = get(&app, "/metrics").await;
    assert_eq!(metric(&text, "lagscope_api_lag_requests_served"), 0.0);
    assert_eq!(metric(&text, "lagscope_api_lag_requests_refused_total"), 1.0);
}

/// A request that waits while the only turn is taken is served once it is given back (within
/// its wait), not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_is_served_when_a_turn_frees_in_time() {
    let (entered_tx, entered) = mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(Some(entered_tx)));
    let aggregate: LagAggregator = Arc::new(move |_rows, query| {
        if let Some(entered) = gate.lock().expect("gate").take() {
            entered.send(()).expect("the test waits");
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(empty_report(query))
    });
    let (app, metrics, _directory) = api(aggregate, LagTurns::new(1, Duration::from_secs(30))).await;
    let first = first_request(&app, entered).await;
    let (status, _, body) = get(&app, LAG).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(first.await.expect("join").0, StatusCode::OK);
    assert_eq!(metrics.api_lag_requests_refused.get(), 0);
}
