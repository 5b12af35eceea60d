//! Scrapers against what the simulated nodes expose natively (`lagscope sim --serve-native`'s
//! router, in-process): Hadoop `/jmx` of NameNodes and a Router, Ozone OM `/jmx`,
//! Elasticsearch and OpenSearch node stats, Prometheus text. Each value the simulator's nodes
//! reported comes back under the conventions' name with the same value, and target health
//! (up, samples, last error) shows in `/api/v1/health` and `/metrics`.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lagscope::Server;
use lagscope_collector::scrape::{ScrapeKind, ScrapeTarget};
use lagscope_sim::native::NativeState;
use lagscope_sim::{SimConfig, run};
use lagscope_store::{SqliteStore, Store, TimeRange};
use serde_json::Value;

fn simulated_nodes() -> NativeState {
    let mut state = NativeState::default();
    for scenario in ["hdfs-observer-lag-storm", "hdfs-no-namenodes", "ozone-apply-lag", "es-shard-level-pressure"] {
        let mut requests = Vec::new();
        run(&SimConfig::new(scenario), &mut requests).expect("scenario runs");
        requests.iter().for_each(|request| state.observe(request));
    }
    state
}

/// The latest value a simulated node reported for a metric (the largest across its series,
/// as the native endpoints render it).
fn reported(state: &NativeState, node: &str, metric: &str) -> f64 {
    state.nodes[node].metrics[metric].values().copied().fold(f64::MIN, f64::max)
}

fn role_of(state: &NativeState, node: &str) -> String {
    state.nodes[node]
        .metrics
        .get("lagscope.server.role")
        .and_then(|series| series.keys().next())
        .map_or_else(String::new, |labels| labels.get("lagscope.node.role").cloned().unwrap_or_default())
}

fn target(name: &str, url: String, kind: ScrapeKind, labels: &[(&str, &str)]) -> ScrapeTarget {
    ScrapeTarget {
        name: name.to_string(),
        url,
        kind,
        interval_seconds: 0.2,
        timeout_seconds: 0.2,
        labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
        tenant: None,
    }
}

async fn latest(store: &SqliteStore, metric: &str, matchers: &[(&str, &str)]) -> Option<f64> {
    let matchers: Vec<(String, String)> =
        matchers.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
    let series = store.series_samples(metric, &matchers, TimeRange::ALL).await.expect("series");
    assert!(series.len() <= 1, "{metric} {matchers:?}: one series expected, got {series:?}");
    series.first()?.points.last()?.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_native_endpoints_arrive_under_the_conventions_names_with_the_nodes_values() {
    let state = simulated_nodes();
    let observer = state.nodes.keys().find(|node| role_of(&state, node) == "observer").expect("an observer").clone();
    let active = state.nodes.keys().find(|node| role_of(&state, node) == "active").expect("an active").clone();
    let leader = state.nodes.keys().find(|node| role_of(&state, node) == "leader").expect("an OM leader").clone();
    let router = state
        .nodes
        .iter()
        .find(|(_, node)| node.metrics.contains_key("lagscope.router.no_namenodes"))
        .map(|(name, _)| name.clone())
        .expect("a router");
    let native_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let native = native_listener.local_addr().expect("address");
    let handle = Arc::new(Mutex::new(state.clone()));
    tokio::spawn(async move { axum::serve(native_listener, lagscope::native_server::router(handle)).await });

    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    let base = format!("http://{native}");
    let hdfs = [("lagscope.cluster", "hdfs-prod"), ("lagscope.namespace", "ns1")];
    config.scrape = vec![
        target("observer", format!("{base}/{observer}/jmx"), ScrapeKind::HadoopJmx, &hdfs),
        target("active", format!("{base}/{active}/jmx"), ScrapeKind::HadoopJmx, &hdfs),
        target("router", format!("{base}/{router}/jmx"), ScrapeKind::HadoopJmx, &hdfs),
        target("om-leader", format!("{base}/{leader}/jmx"), ScrapeKind::OzoneJmx, &[("lagscope.cluster", "ozone-1")]),
        target(
            "es",
            format!("{base}/es-node-1/_nodes/stats/indexing_pressure"),
            ScrapeKind::ElasticsearchIndexingPressure,
            &[],
        ),
        target(
            "opensearch",
            format!("{base}/es-node-1/_nodes/stats/shard_indexing_pressure"),
            ScrapeKind::OpensearchShardIndexingPressure,
            &[],
        ),
        target("prometheus", format!("{base}/metrics"), ScrapeKind::Prometheus, &[]),
        // Failing targets: nothing listening, an unknown node (404), the wrong kind of body.
        target("dead", "http://127.0.0.1:9/jmx".to_string(), ScrapeKind::HadoopJmx, &[]),
        target("missing", format!("{base}/no-such-node/jmx"), ScrapeKind::HadoopJmx, &[]),
        target("wrong-kind", format!("{base}/metrics"), ScrapeKind::HadoopJmx, &[]),
    ];
    config.validate().expect("valid configuration");
    let server = Server::start(&config).await.expect("server starts");

    // Every target scraped at least twice.
    let deadline = Instant::now() + Duration::from_secs(20);
    let health = loop {
        let health: Value = reqwest::get(format!("http://{}/api/v1/health", server.api_addr))
            .await
            .expect("health")
            .json()
            .await
            .expect("json");
        let scraped = health["scrape"].as_object().is_some_and(|targets| {
            targets.len() == config.scrape.len() && targets.values().all(|target| target["scrapes"].as_u64() >= Some(2))
        });
        if scraped {
            break health;
        }
        assert!(Instant::now() < deadline, "targets not scraped in time: {}", health["scrape"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for name in ["observer", "active", "router", "om-leader", "es", "opensearch", "prometheus"] {
        let status = &health["scrape"][name];
        assert_eq!(status["up"], true, "{name}: {status}");
        assert!(status["samples"].as_u64() > Some(0), "{name}: {status}");
        assert_eq!(status["last_error"], Value::Null, "{name}: {status}");
    }
    let error = |name: &str| health["scrape"][name]["last_error"].as_str().unwrap_or_default().to_string();
    assert_eq!(health["scrape"]["dead"]["up"], false);
    assert!(error("dead").contains("cannot fetch http://127.0.0.1:9/jmx"), "{}", error("dead"));
    assert!(error("missing").contains("HTTP 404"), "{}", error("missing"));
    assert!(error("wrong-kind").contains("not Hadoop /jmx JSON"), "{}", error("wrong-kind"));
    let metrics =
        reqwest::get(format!("http://{}/metrics", server.api_addr)).await.expect("m").text().await.expect("t");
    assert!(metrics.contains("lagscope_scrape_up{target=\"dead\",kind=\"hadoop_jmx\"} 0"), "{metrics}");
    assert!(metrics.contains("lagscope_scrape_up{target=\"es\",kind=\"elasticsearch_indexing_pressure\"} 1"));
    server.shutdown().await.expect("clean shutdown");

    let store = SqliteStore::open_dir(directory.path()).await.expect("store");
    let from = |target: &'static str| ("lagscope.scrape.target", target);
    // NameNodes: applied on the observer, committed on the active, the observer's role.
    assert_eq!(
        latest(&store, "lagscope.server.applied_state", &[from("observer")]).await,
        Some(reported(&state, &observer, "lagscope.server.applied_state").trunc())
    );
    assert_eq!(
        latest(&store, "lagscope.server.committed_state", &[from("active")]).await,
        Some(reported(&state, &active, "lagscope.server.committed_state").trunc())
    );
    assert_eq!(latest(&store, "lagscope.server.committed_state", &[from("observer")]).await, None);
    assert_eq!(
        latest(&store, "lagscope.server.requeue_calls", &[from("observer"), ("lagscope.node.id", &observer)]).await,
        Some(reported(&state, &observer, "lagscope.server.requeue_calls").trunc())
    );
    let role = store
        .series_samples("lagscope.server.role", &[("lagscope.scrape.target".into(), "observer".into())], TimeRange::ALL)
        .await
        .expect("role");
    assert_eq!(role[0].key.labels.get("lagscope.node.role").map(String::as_str), Some("observer"));
    assert_eq!(role[0].key.labels.get("lagscope.namespace").map(String::as_str), Some("ns1"), "target labels kept");
    assert_eq!(
        latest(&store, "lagscope.router.no_namenodes", &[from("router")]).await,
        Some(reported(&state, &router, "lagscope.router.no_namenodes").trunc())
    );
    // Ozone: the leader's applied index, which is also its committed state.
    let leader_applied = reported(&state, &leader, "lagscope.server.applied_state").trunc();
    assert_eq!(latest(&store, "lagscope.server.applied_state", &[from("om-leader")]).await, Some(leader_applied));
    assert_eq!(latest(&store, "lagscope.server.committed_state", &[from("om-leader")]).await, Some(leader_applied));
    // Elasticsearch: the node's primary bytes are the sum over its shards; OpenSearch per shard.
    let shards: BTreeMap<String, f64> = state.nodes["es-node-1"].metrics["lagscope.shard.inflight_bytes"]
        .iter()
        .map(|(labels, value)| (labels["lagscope.namespace"].clone(), *value))
        .collect();
    let es_primary = latest(
        &store,
        "lagscope.shard.inflight_bytes",
        &[from("es"), ("lagscope.shard.role", "primary"), ("lagscope.node.id", "es-node-1")],
    )
    .await;
    assert_eq!(es_primary, Some(shards.values().sum::<f64>().trunc()));
    for (shard, bytes) in &shards {
        let stored = latest(
            &store,
            "lagscope.shard.inflight_bytes",
            &[from("opensearch"), ("lagscope.shard.role", "primary"), ("lagscope.namespace", shard)],
        )
        .await;
        assert_eq!(stored, Some(bytes.trunc()), "shard {shard}");
    }
    // Prometheus: the conventions' names and labels come back from their underscore forms.
    let from_prometheus = store
        .series_samples(
            "lagscope.server.applied_state",
            &[("lagscope.scrape.target".into(), "prometheus".into()), ("lagscope.node.id".into(), observer.clone())],
            TimeRange::ALL,
        )
        .await
        .expect("series");
    assert_eq!(from_prometheus.len(), 1, "{from_prometheus:?}");
    assert_eq!(
        from_prometheus[0].points.last().map(|point| point.1),
        Some(Some(reported(&state, &observer, "lagscope.server.applied_state")))
    );
    assert_eq!(
        from_prometheus[0].key.labels.get("lagscope.source.metric").map(String::as_str),
        Some("lagscope_server_applied_state")
    );
    store.close().await;
}
