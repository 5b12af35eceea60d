//! Paging end to end: simulated telemetry into `serve`, anomalies found live, incidents
//! delivered to a real Alertmanager (Debian's `prometheus-alertmanager`, started here on
//! loopback) and to PagerDuty- and webhook-shaped receivers that record what they get and
//! can be made to fail; the outbox surviving a restart.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use lagscope::alerting::AlertsConfig;
use lagscope_alerts::{Receiver, ReceiverKind, Route};
use serde_json::Value;
use support::{get_json, local_config};

/// The Alertmanager binary: `LAGSCOPE_TEST_ALERTMANAGER`, else Debian's. Missing, the test
/// fails and says how to get it (`.ci/run` installs it).
fn alertmanager_binary() -> PathBuf {
    let path = std::env::var_os("LAGSCOPE_TEST_ALERTMANAGER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus-alertmanager"));
    assert!(
        path.exists(),
        "no Alertmanager at {}: install Debian's prometheus-alertmanager (scripts/test does) or set LAGSCOPE_TEST_ALERTMANAGER",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A real Alertmanager on loopback, killed when dropped.
struct Alertmanager {
    child: Child,
    url: String,
}

impl Alertmanager {
    async fn start(directory: &Path) -> Self {
        let config = directory.join("alertmanager.yml");
        std::fs::write(&config, "route:\n  receiver: \"null\"\n  group_wait: 0s\nreceivers:\n  - name: \"null\"\n")
            .expect("config");
        let port = free_port();
        let child = Command::new(alertmanager_binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", directory.join("alertmanager-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("alertmanager starts");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if reqwest::get(format!("{url}/-/ready")).await.is_ok_and(|response| response.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "alertmanager did not become ready at {url}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self { child, url }
    }

    /// The alerts Alertmanager holds as active (resolved ones are not listed).
    async fn active(&self) -> Vec<Value> {
        let body: Value =
            reqwest::get(format!("{}/api/v2/alerts", self.url)).await.expect("list").json().await.expect("json");
        body.as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn alerts_config(receivers: Vec<Receiver>) -> AlertsConfig {
    let routes =
        receivers.iter().map(|receiver| Route { receiver: receiver.name.clone(), ..Route::default() }).collect();
    AlertsConfig {
        external_url: "http://lagscope.test:8080".to_string(),
        resolve_after: "2s".to_string(),
        window_resolve_after: "3s".to_string(),
        poll_interval_ms: 50,
        retry_first_ms: 100,
        retry_longest_seconds: 2,
        receivers,
        routes,
        ..AlertsConfig::default()
    }
}

async fn simulate(server: &lagscope::Server, scenario: &str, seconds: i64) {
    support::feed_simulator(server, scenario, seconds).await;
}

async fn wait_for<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_reach_a_real_alertmanager_and_resolve_when_the_window_ends() {
    let directory = tempfile::tempdir().expect("temp dir");
    let alertmanager = Alertmanager::start(directory.path()).await;
    let mut config = local_config(&directory.path().join("store"));
    config.alerts = alerts_config(vec![Receiver {
        name: "am".to_string(),
        kind: ReceiverKind::Alertmanager { url: alertmanager.url.clone() },
    }]);
    // Long enough for the incident of the window to stay firing between the two phases.
    config.alerts.resolve_after = "10m".to_string();
    let server = lagscope::Server::start(&config).await.expect("serve");

    // The first 40 s of the scenario: the router's NoNamenodesAvailable window (8 s to 67 s)
    // is open at the end of the data.
    simulate(&server, "hdfs-no-namenodes", 40).await;
    let window = wait_for("the window's alert in Alertmanager", Duration::from_secs(20), async || {
        alertmanager.active().await.into_iter().find(|alert| alert["labels"]["alertname"] == "no_namenodes_window")
    })
    .await;
    let labels = &window["labels"];
    assert_eq!(labels["cluster"], "hdfs-prod", "{window:#}");
    assert_eq!(labels["namespace"], "ns60", "{window:#}");
    assert_eq!(labels["node"], "router-1", "{window:#}");
    assert_eq!(labels["severity"], "critical", "{window:#}");
    // The window started 8 s into the scenario (2026-01-01T00:00:00Z).
    assert!(window["startsAt"].as_str().is_some_and(|at| at.starts_with("2026-01-01T00:00:0")), "{window:#}");
    let link = window["generatorURL"].as_str().expect("generator URL");
    assert!(link.starts_with("http://lagscope.test:8080/anomalies/"), "{link}");
    let summary = window["annotations"]["summary"].as_str().expect("summary");
    assert!(summary.contains("ns60"), "{summary}");
    assert!(window["annotations"]["cause"].as_str().is_some_and(|cause| !cause.is_empty()), "{window:#}");

    // The whole scenario (the first 40 s again, stored once, then the rest): the window ends
    // at 67 s, and Alertmanager no longer holds the alert as active.
    simulate(&server, "hdfs-no-namenodes", 120).await;
    wait_for("the window's alert resolved in Alertmanager", Duration::from_secs(20), async || {
        let active = alertmanager.active().await;
        (!active.iter().any(|alert| alert["labels"]["alertname"] == "no_namenodes_window")).then_some(())
    })
    .await;
    // The delivery record: one trigger and one resolve for the incident, both delivered.
    let (_, record) = get_json(&server, "/api/v1/alerts?limit=1000").await;
    let messages = record["messages"].as_array().expect("messages");
    let of_window: Vec<&Value> = messages
        .iter()
        .filter(|message| message["dedup_key"].as_str().is_some_and(|key| key.contains("no_namenodes")))
        .collect();
    let events: Vec<&str> = of_window.iter().rev().filter_map(|message| message["event"].as_str()).collect();
    assert_eq!(events.first(), Some(&"trigger"), "{of_window:#?}");
    assert_eq!(events.last(), Some(&"resolve"), "{of_window:#?}");
    assert!(of_window.iter().all(|message| message["state"] == "delivered"), "{of_window:#?}");
    assert!(!events.contains(&"trigger") || events.iter().filter(|event| **event == "trigger").count() == 1);
    server.shutdown().await.expect("shutdown");
}

/// What a recording receiver was sent and how it answered.
#[derive(Default)]
struct Recorder {
    /// Requests answered 2xx, in order: (path, body).
    taken: Vec<(String, Value)>,
    /// How many requests were refused (429 or 500).
    refused: usize,
    /// Refuse the next this many requests: first with 429 (Retry-After: 1), then 500.
    refuse_next: usize,
}

type Shared = Arc<Mutex<Recorder>>;

async fn record(State(shared): State<Shared>, uri: axum::http::Uri, body: String) -> axum::response::Response {
    let mut recorder = shared.lock().expect("recorder");
    if recorder.refuse_next > 0 {
        recorder.refuse_next -= 1;
        recorder.refused += 1;
        return if recorder.refuse_next % 2 == 1 {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response()
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "try later").into_response()
        };
    }
    let value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    recorder.taken.push((uri.path().to_string(), value));
    (StatusCode::ACCEPTED, "{\"status\":\"success\"}").into_response()
}

/// Starts the recording receiver on `address` (a port chosen before, so that lagscope can be
/// configured with it while nothing listens there yet).
async fn start_recorder(address: SocketAddr, shared: Shared) -> tokio::task::JoinHandle<()> {
    let app = axum::Router::new().fallback(record).with_state(shared);
    let listener = tokio::net::TcpListener::bind(address).await.expect("bind recorder");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("recorder serves");
    })
}

/// (receiver kind, dedup key, event) of every message the recorder took, in order:
/// PagerDuty's `dedup_key` and `event_action`; the webhook's incident (the label its `groupKey`
/// groups by) and `status`, named as the outbox names them (`trigger`, `resolve`).
fn taken_events(recorder: &Recorder) -> Vec<(String, String, String)> {
    recorder
        .taken
        .iter()
        .map(|(path, body)| {
            let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
            if path.starts_with("/pagerduty") {
                ("pagerduty".to_string(), text(&body["dedup_key"]), text(&body["event_action"]))
            } else {
                let event = match body["status"].as_str() {
                    Some("firing") => "trigger".to_string(),
                    Some("resolved") => "resolve".to_string(),
                    other => format!("{other:?}"),
                };
                let group = text(&body["groupKey"]);
                let key = group.strip_prefix("{}:{incident=\"").and_then(|rest| rest.strip_suffix("\"}"));
                ("webhook".to_string(), key.unwrap_or(&group).to_string(), event)
            }
        })
        .collect()
}

fn receivers_at(address: SocketAddr) -> Vec<Receiver> {
    vec![
        Receiver {
            name: "pd".to_string(),
            kind: ReceiverKind::Pagerduty {
                routing_key: "R0UT1NGK3Y".to_string(),
                url: format!("http://{address}/pagerduty/v2/enqueue"),
            },
        },
        Receiver { name: "hook".to_string(), kind: ReceiverKind::Webhook { url: format!("http://{address}/hook") } },
    ]
}

/// A configuration paging a PagerDuty and a webhook receiver at an address where nothing
/// listens yet (a recorder is started there later), over a store in the returned directory.
fn with_recording_receivers() -> (tempfile::TempDir, SocketAddr, lagscope::Config) {
    let directory = tempfile::tempdir().expect("temp dir");
    let address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let mut config = local_config(&directory.path().join("store"));
    config.alerts = alerts_config(receivers_at(address));
    (directory, address, config)
}

/// What each receiver took is exactly what lagscope's outbox (`messages`, from
/// `/api/v1/alerts`) holds for it, message for message in the order enqueued: nothing lost,
/// nothing delivered twice, whatever refusals came between. Each incident's events go
/// trigger, resolve (again, when the node's next incident opens under the same key after a
/// resolve: how per-read anomalies group depends on when the alerter sees them).
fn assert_delivered_as_enqueued(
    taken: &[(String, String, String)],
    messages: &[Value],
) -> BTreeMap<(String, String), Vec<String>> {
    let group = |events: &mut dyn Iterator<Item = (String, String, String)>| {
        let mut by_incident: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (receiver, key, event) in events {
            by_incident.entry((receiver, key)).or_default().push(event);
        }
        by_incident
    };
    let mut enqueued: Vec<&Value> = messages.iter().collect();
    enqueued.sort_by_key(|message| message["id"].as_i64());
    let kind_of = |receiver: &str| match receiver {
        "pd" => "pagerduty".to_string(),
        "hook" => "webhook".to_string(),
        other => other.to_string(),
    };
    let outbox = group(&mut enqueued.iter().map(|message| {
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        (
            kind_of(message["receiver"].as_str().unwrap_or_default()),
            text(&message["dedup_key"]),
            text(&message["event"]),
        )
    }));
    let by_incident = group(&mut taken.iter().cloned());
    assert_eq!(by_incident, outbox, "what the receivers took, against the outbox");
    for ((receiver, key), events) in &by_incident {
        let alternating = events.chunks(2).all(|pair| pair == ["trigger", "resolve"]);
        assert!(alternating, "{receiver} {key}: {events:?}");
    }
    by_incident
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagerduty_and_webhook_get_every_alert_once_after_failures() {
    // The store lives in `_directory` until the test ends.
    let (_directory, address, config) = with_recording_receivers();
    let server = lagscope::Server::start(&config).await.expect("serve");

    // Nothing listens: connections are refused while the scenarios run: a router's window
    // opens and ends; a pool's stale reads (many anomalies, a few serving nodes) group into
    // incidents per node, each resolved 2 s after its last anomaly.
    simulate(&server, "hdfs-no-namenodes", 120).await;
    simulate(&server, "hdfs-pool-not-advanced", 20).await;
    wait_for("messages waiting after refused connections", Duration::from_secs(20), async || {
        let (_, record) = get_json(&server, "/api/v1/alerts?limit=1000").await;
        let messages = record["messages"].as_array().cloned().unwrap_or_default();
        let retried = messages.iter().any(|message| {
            message["state"] == "pending"
                && message["attempts"].as_i64() > Some(0)
                && message["last_error"].as_str().is_some_and(|error| !error.is_empty())
        });
        (retried && messages.iter().any(|message| message["event"] == "resolve")).then_some(())
    })
    .await;
    // The receivers come up, answering 429 and 500 for a while, then taking everything.
    let shared: Shared = Arc::new(Mutex::new(Recorder { refuse_next: 6, ..Recorder::default() }));
    let receiver = start_recorder(address, shared.clone()).await;
    let delivered = wait_for("every message delivered", Duration::from_secs(60), async || {
        let (_, record) = get_json(&server, "/api/v1/alerts?limit=1000").await;
        let messages = record["messages"].as_array().cloned().unwrap_or_default();
        (!messages.is_empty() && messages.iter().all(|message| message["state"] == "delivered")).then_some(messages)
    })
    .await;
    let recorder = std::mem::take(&mut *shared.lock().expect("recorder"));
    assert_eq!(recorder.refused, 6, "the receiver refused six times before taking any");
    let by_incident = assert_delivered_as_enqueued(&taken_events(&recorder), &delivered);
    assert!(by_incident.keys().any(|(receiver, key)| receiver == "pagerduty" && key.contains("no_namenodes_window")));
    assert!(by_incident.keys().any(|(receiver, _)| receiver == "webhook"));
    let (_, stale) = get_json(&server, "/api/v1/anomalies?kind=stale_read&limit=1000").await;
    let stale_reads = stale["anomalies"].as_array().map_or(0, Vec::len);
    let stale_incidents =
        by_incident.keys().filter(|(receiver, key)| receiver == "pagerduty" && key.contains("stale_read")).count();
    assert!(
        stale_incidents >= 1 && stale_incidents < stale_reads,
        "{stale_incidents} incidents for {stale_reads} stale reads"
    );
    // PagerDuty's events carry what the Events API v2 asks for.
    let trigger = recorder
        .taken
        .iter()
        .find(|(path, body)| path.starts_with("/pagerduty") && body["event_action"] == "trigger")
        .map(|(_, body)| body)
        .expect("a trigger");
    assert_eq!(trigger["routing_key"], "R0UT1NGK3Y");
    let summary = trigger["payload"]["summary"].as_str().expect("summary");
    assert!(!summary.is_empty() && summary.len() <= 1024);
    assert!(trigger["payload"]["custom_details"]["evidence"].is_object(), "{trigger:#}");
    assert!(trigger["links"][0]["href"].as_str().is_some_and(|href| href.contains("/anomalies/")));
    let hook = recorder.taken.iter().find(|(path, _)| path == "/hook").map(|(_, body)| body).expect("a webhook");
    assert_eq!(hook["version"], "4");
    assert_eq!(hook["receiver"], "hook");
    receiver.abort();
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_in_the_outbox_survive_a_restart() {
    // The store lives in `_directory` until the test ends.
    let (_directory, address, config) = with_recording_receivers();
    let server = lagscope::Server::start(&config).await.expect("serve");
    simulate(&server, "hdfs-no-namenodes", 120).await;
    let waiting = wait_for("resolves in the outbox", Duration::from_secs(20), async || {
        let (_, record) = get_json(&server, "/api/v1/alerts?limit=1000").await;
        let messages = record["messages"].as_array().cloned().unwrap_or_default();
        messages.iter().any(|message| message["event"] == "resolve").then_some(messages)
    })
    .await;
    assert!(waiting.iter().all(|message| message["state"] == "pending"), "{waiting:#?}");
    server.shutdown().await.expect("shutdown");

    // The receiver is back; so is lagscope, over the same store.
    let shared: Shared = Arc::new(Mutex::new(Recorder::default()));
    let receiver = start_recorder(address, shared.clone()).await;
    let server = lagscope::Server::start(&config).await.expect("serve again");
    let delivered = wait_for("the outbox delivered after the restart", Duration::from_secs(30), async || {
        let (_, record) = get_json(&server, "/api/v1/alerts?limit=1000").await;
        let messages = record["messages"].as_array().cloned().unwrap_or_default();
        messages.iter().all(|message| message["state"] == "delivered").then_some(messages)
    })
    .await;
    assert!(delivered.len() >= waiting.len(), "nothing lost: {} then {}", waiting.len(), delivered.len());
    let recorder = std::mem::take(&mut *shared.lock().expect("recorder"));
    assert_delivered_as_enqueued(&taken_events(&recorder), &delivered);
    receiver.abort();
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_test_sends_a_test_alert_and_names_what_is_wrong() {
    let directory = tempfile::tempdir().expect("temp dir");
    let alertmanager = Alertmanager::start(directory.path()).await;
    let config = directory.path().join("lagscope.toml");
    std::fs::write(
        &config,
        format!(
            "[alerts]\n[[alerts.receiver]]\nname = \"am\"\nkind = \"alertmanager\"\nurl = \"{}\"\n\
             [[alerts.receiver]]\nname = \"down\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n\
             [[alerts.route]]\nreceiver = \"am\"\n",
            alertmanager.url,
            free_port()
        ),
    )
    .expect("config");
    let run = move |receiver: &str| {
        Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["alerts", "test", "--config"])
            .arg(&config)
            .args(["--receiver", receiver])
            .output()
            .expect("lagscope runs")
    };
    let sent = tokio::task::spawn_blocking(move || (run("am"), run("down"), run("nobody"))).await.expect("join");
    let (ok, down, unknown) = sent;
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stderr).contains("took the test alert"));
    let test = alertmanager.active().await.into_iter().find(|alert| alert["labels"]["alertname"] == "lagscope_test");
    assert!(test.is_some(), "Alertmanager holds the test alert");
    assert!(!down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("did not take the test alert"), "{down:?}");
    assert!(!unknown.status.success());
    let message = String::from_utf8_lossy(&unknown.stderr);
    assert!(message.contains("\"nobody\"") && message.contains("am, down"), "{message}");
}
