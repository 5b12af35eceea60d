//! Several `lagscope serve` processes on one PostgreSQL database: the live analysis is split
//! between them by leases, an instance killed mid-run has its shards taken over within the
//! lease time, and every anomaly the simulator's truth expects is reported exactly once.

mod support;

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

use std::time::{Duration, Instant};

use lagscope_sim::score::{Found, score};
use lagscope_sim::{Request, SECOND, SimConfig, Truth};
use prost::Message;
use serde_json::Value;
use support::ServeProcess;

const LEASE_SECONDS: u64 = 2;

fn serve_config(database_url: &str, instance: &str) -> String {
    format!(
        "[server]\ndatabase_url = {database_url:?}\n\n[cluster]\ninstance_id = {instance:?}\n\
         lease_seconds = {LEASE_SECONDS}\npoll_interval_ms = 100\n"
    )
}

async fn get(api: &str, path: &str) -> Value {
    let response = reqwest::get(format!("http://{api}{path}")).await.unwrap_or_else(|error| panic!("{path}: {error}"));
    assert!(response.status().is_success(), "{path} answered {}", response.status());
    response.json().await.expect("JSON body")
}

/// The shards `instance` holds, as `api` reports them.
async fn shards_of(api: &str, instance: &str) -> usize {
    let cluster = get(api, "/api/v1/cluster").await;
    cluster["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["instance"] == instance)
        .and_then(|entry| entry["shards"].as_array())
        .map_or(0, Vec::len)
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// Sends one simulator request over OTLP/HTTP protobuf; `false` if the instance is gone.
async fn send(client: &reqwest::Client, otlp: &str, request: &Request) -> bool {
    let (path, body) = match request {
        Request::Traces(request) => ("/v1/traces", request.encode_to_vec()),
        Request::Metrics(request) => ("/v1/metrics", request.encode_to_vec()),
        Request::Logs(request) => ("/v1/logs", request.encode_to_vec()),
    };
    match client
        .post(format!("http://{otlp}{path}"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
    {
        Ok(response) => {
            assert!(response.status().is_success(), "{otlp}{path} answered {}", response.status());
            true
        }
        Err(error) if error.is_connect() => false,
        Err(error) => panic!("{otlp}{path}: {error}"),
    }
}

/// The cluster a request's first resource names (requests of one cluster must arrive in order).
fn cluster_of(request: &Request) -> Option<String> {
    let resource = match request {
        Request::Traces(request) => request.resource_spans.first().and_then(|first| first.resource.as_ref()),
        Request::Metrics(request) => request.resource_metrics.first().and_then(|first| first.resource.as_ref()),
        Request::Logs(request) => request.resource_logs.first().and_then(|first| first.resource.as_ref()),
    }?;
    resource
        .attributes
        .iter()
        .find(|attribute| attribute.key == lagscope_model::conventions::CLUSTER)
        .map(|attribute| format!("{:?}", attribute.value))
}

/// Sends every request, spread over `targets` one request each in turn: the requests of one
/// cluster one after another, acknowledged before the next (as one exporter sends), the
/// clusters concurrently.
async fn send_all(client: &reqwest::Client, requests: &[Request], targets: &[&str]) {
    let mut by_cluster: std::collections::BTreeMap<Option<String>, Vec<(usize, &Request)>> = Default::default();
    for (index, request) in requests.iter().enumerate() {
        by_cluster.entry(cluster_of(request)).or_default().push((index, request));
    }
    let senders = by_cluster.into_values().map(|group| async move {
        for (index, request) in group {
            let target = targets[index % targets.len()];
            assert!(send(client, target, request).await, "{target} is up");
        }
    });
    futures::future::join_all(senders).await;
}

/// Every anomaly the API lists, page by page.
async fn all_anomalies(api: &str) -> Vec<Value> {
    let mut anomalies = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let page = match before {
            Some(id) => get(api, &format!("/api/v1/anomalies?limit=1000&before={id}")).await,
            None => get(api, "/api/v1/anomalies?limit=1000").await,
        };
        anomalies.extend(page["anomalies"].as_array().cloned().unwrap_or_default());
        match page["next_before"].as_i64() {
            Some(id) => before = Some(id),
            None => return anomalies,
        }
    }
}

fn found(anomaly: &Value) -> Found {
    let text = |field: &str| anomaly[field].as_str().map(str::to_string);
    Found {
        kind: text("kind").expect("kind"),
        cluster: text("cluster"),
        namespace: text("namespace"),
        client_id: text("client_id"),
        node_id: text("node_id"),
        start_unix_nano: anomaly["start_unix_nano"].as_i64().expect("start"),
        end_unix_nano: anomaly["end_unix_nano"].as_i64().expect("end"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_split_the_analysis_and_survive_one_being_killed() {
    let database_url = postgres_support::fresh_database().await;
    let directory = tempfile::tempdir().expect("temp dir");
    let a = ServeProcess::start(&directory.path().join("a"), &serve_config(&database_url, "a"));
    let b = ServeProcess::start(&directory.path().join("b"), &serve_config(&database_url, "b"));
    let b_api = b.api.clone();
    // They split the shards between them.
    let half = (lagscope_store::SHARDS / 2) as usize;
    wait_for("the shards split between a and b", Duration::from_secs(30), async || {
        shards_of(&b_api, "a").await == half && shards_of(&b_api, "b").await == half
    })
    .await;

    let mut sim = SimConfig::new("mixed");
    sim.duration = Some(40 * SECOND);
    let (truth, requests): (Truth, Vec<Request>) = tokio::task::spawn_blocking(move || {
        let mut requests = Vec::new();
        let truth = lagscope_sim::run(&sim, &mut requests).expect("the simulator runs");
        (truth, requests)
    })
    .await
    .expect("sim thread");
    assert!(truth.anomalies.len() > 20, "the run must expect anomalies of many kinds");
    let run_started = Instant::now();
    eprintln!("{} requests, {} anomalies expected", requests.len(), truth.anomalies.len());

    // A load balancer spreads the requests over both, request by request; each cluster's
    // senders send in order, the clusters side by side. a is killed halfway (SIGKILL: no
    // release, its leases must run out) and b receives the rest.
    let client = reqwest::Client::new();
    let middle = requests.len() / 2;
    send_all(&client, &requests[..middle], &[a.otlp_http.as_str(), b.otlp_http.as_str()]).await;
    assert_eq!(shards_of(&b_api, "a").await, half, "a holds its shards when it dies");
    let pending_at_kill = get(&b_api, "/api/v1/cluster").await["pending_marks"].as_u64().unwrap_or(0);
    a.kill();
    let killed_at = Instant::now();
    let b_otlp = b.otlp_http.clone();
    let rest = requests[middle..].to_vec();
    let sender = tokio::spawn(async move { send_all(&client, &rest, &[b_otlp.as_str()]).await });
    wait_for("b takes over a's shards", Duration::from_secs(LEASE_SECONDS * 5), async || {
        shards_of(&b_api, "b").await == lagscope_store::SHARDS as usize
    })
    .await;
    let takeover = killed_at.elapsed();
    eprintln!(
        "a killed with {pending_at_kill} marks pending; b held every shard {} ms later (lease {LEASE_SECONDS} s)",
        takeover.as_millis()
    );
    // Within the lease (plus one renewal round of b, a third of it) and scheduling slack.
    assert!(
        takeover
            <= Duration::from_secs(LEASE_SECONDS) + Duration::from_secs(LEASE_SECONDS) / 3 + Duration::from_secs(2),
        "takeover took {takeover:?}"
    );
    sender.await.expect("the rest is sent");
    eprintln!("everything sent after {:?}", run_started.elapsed());
    let cluster = get(&b_api, "/api/v1/cluster").await;
    let a_entry = cluster["instances"].as_array().into_iter().flatten().find(|entry| entry["instance"] == "a");
    assert_eq!(a_entry.map(|entry| entry["alive"].clone()), Some(Value::Bool(false)), "{cluster}");

    // Everything committed is analysed: no mark waits anywhere.
    wait_for("every mark analysed", Duration::from_secs(180), async || {
        get(&b_api, "/api/v1/cluster").await["pending_marks"].as_u64() == Some(0)
    })
    .await;
    eprintln!("everything analysed after {:?}", run_started.elapsed());
    let anomalies = all_anomalies(&b_api).await;
    let mut fingerprints: Vec<&str> =
        anomalies.iter().map(|anomaly| anomaly["fingerprint"].as_str().expect("fingerprint")).collect();
    fingerprints.sort_unstable();
    fingerprints.dedup();
    assert_eq!(fingerprints.len(), anomalies.len(), "one row per fingerprint");
    let found: Vec<Found> = anomalies.iter().map(found).collect();
    let scores = score(&truth, &found);
    for row in &scores {
        eprintln!(
            "{:<28} expected {:>4} found {:>4} missed {:>3} false {:>3}",
            row.kind, row.expected, row.found, row.missed, row.false_positives
        );
    }
    let failing: Vec<_> = scores.iter().filter(|row| row.missed > 0 || row.false_positives > 0).collect();
    assert!(failing.is_empty(), "every expected anomaly once, nothing else: {failing:#?}");
    b.stop();
}
